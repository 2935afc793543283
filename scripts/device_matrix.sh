#!/usr/bin/env bash
# One device call (nvidia-h200): the twin's validation matrix (issue 16) for ONE class set. Calibrate the 5-layer
# DeepSeek-V3 FP8 executor once, then validate the simulator on that one profile against the executor for the set's
# workload classes at three loads, each level replayed once unmeasured and then RUNS times (median).
# Run from the repo root with `.whl` carried:  bash scripts/device_matrix.sh
#
# Class sets the issue needs, one device call each, under the 600 s call with install. Measured walls of the calls of
# 2026-12-02 (piecewise graphs off; benchmarks/gpu/issue16_h200/run{6,7,8,9}_*/): fixed part 118-138 s (install and the
# SDPA probe 16-21 s, kernel JIT warm-up 23-29 s, calibration 78-92 s), then each level 1 unmeasured + RUNS measured
# passes (the class-wide warm-up replay is skipped).
#   chat + agentic (run 6 at a901163: 304 s):
#     MATRIX_ARGS="--classes chat,agentic --no-async-overlap" REQS=96 RUNS=3 bash scripts/device_matrix.sh
#   chat + agentic + prefill-heavy with shared prefixes (run 7 at 9450163: 486 s):
#     MATRIX_ARGS="--classes chat,agentic,summarize --no-async-overlap" REQS=96 RUNS=3 T_BUDGET=575 bash scripts/device_matrix.sh
#   prefill-heavy alone (run 5 at 646970b: 295 s):
#     MATRIX_ARGS="--classes summarize --no-async-overlap" REQS=96 RUNS=3 bash scripts/device_matrix.sh
#   long decode + beyond the calibration grid (prompts 8.5-12k, decodes at 8.5-12k context; run 8 at 178a4af: 428 s):
#     MATRIX_ARGS="--classes reasoning,longctx --max-model-len 16384 --class-requests reasoning=32,longctx=12 --no-async-overlap" REQS=32 RUNS=3 T_BUDGET=580 bash scripts/device_matrix.sh
#   long decode, short (run 9 at 194822a: 238 s):
#     MATRIX_ARGS="--classes reasoning --no-async-overlap" REQS=16 RUNS=2 T_BUDGET=245 bash scripts/device_matrix.sh
#   reasoning + chat, piecewise graphs on (run 10 at fffa3d2: 354 s):
#     MATRIX_ARGS="--classes reasoning,chat --class-requests reasoning=32,chat=96 --no-async-overlap" REQS=32 RUNS=3 T_BUDGET=580 bash scripts/device_matrix.sh
#   prefill-heavy + agentic with FlashAttention-3 on the prefill path (run 11):
#     MATRIX_ARGS="--classes summarize,agentic --no-async-overlap" REQS=96 RUNS=3 T_BUDGET=580 bash scripts/device_matrix.sh
#   beyond-grid longctx + prefill-heavy + chat on the FA3 engine, chunk device times recorded (run 14 at 21e0d9c: 360 s):
#     MATRIX_ARGS="--classes longctx,summarize,chat --max-model-len 16384 --class-requests longctx=12,summarize=96,chat=96 --no-async-overlap" REQS=96 RUNS=3 T_BUDGET=585 bash scripts/device_matrix.sh
#   long decode + chat on DeepGEMM's dense GEMMs (run 16 at 7312f4b: 522 s, 137 s of it piecewise capture compiles):
#     TWINFER_KERNEL_FP8_GEMM=deepgemm MATRIX_ARGS="--classes reasoning,chat --class-requests reasoning=32,chat=96 --no-async-overlap" REQS=32 RUNS=3 T_BUDGET=530 bash scripts/device_matrix.sh
#   serving's pipelined loop, agentic + chat + reasoning (run 31 at 5ab1ab5, Triton: 443 s):
#     TWINFER_KERNEL_FP8_GEMM=triton MATRIX_ARGS="--classes agentic,chat,reasoning --class-requests agentic=96,chat=96,reasoning=32 --async-overlap" REQS=96 RUNS=3 T_BUDGET=560 bash scripts/device_matrix.sh
#   serving's pipelined loop, prefill-heavy + beyond the grid (run 32 at 10e491e, Triton: 306 s):
#     TWINFER_KERNEL_FP8_GEMM=triton MATRIX_ARGS="--classes summarize,longctx --max-model-len 16384 --class-requests summarize=96,longctx=12 --async-overlap" REQS=96 RUNS=3 T_BUDGET=575 bash scripts/device_matrix.sh
#   serving's pipelined loop on the registry's default kernels (DeepGEMM), chat + agentic (run 33 at 6ae37da: 459 s,
#   163 s of it the DeepGEMM pool's compile); run 34 at b24ed5a added reasoning=32 and ran out of time before it
#   (JIT warm-up 223 s): give DeepGEMM calls two classes at most:
#     MATRIX_ARGS="--classes chat,agentic --class-requests chat=96,agentic=96 --async-overlap" REQS=96 RUNS=3 T_BUDGET=575 bash scripts/device_matrix.sh
#   the pipelined loop priced launch by launch with the held-forward fit, summarize + reasoning + longctx (run 35, Triton):
#     TWINFER_KERNEL_FP8_GEMM=triton MATRIX_ARGS="--classes summarize,reasoning,longctx --max-model-len 16384 --class-requests summarize=96,reasoning=32,longctx=12 --async-overlap" REQS=96 RUNS=3 T_BUDGET=575 bash scripts/device_matrix.sh
#   the matrix at HEAD, longctx with 24 requests (runs 45, 46, 49 missed its low TPOT p50 with 12: the mean of the 6th
#   and 7th request sits on a step of the distribution; run 50 with 24: -1.7%, off the step; 114 s for the class):
#     TWINFER_KERNEL_FP8_GEMM=triton MATRIX_ARGS="--classes summarize,agentic,longctx --max-model-len 16384 --class-requests summarize=96,agentic=96,longctx=24 --async-overlap" REQS=96 RUNS=3 T_BUDGET=590 bash scripts/device_matrix.sh
#     TWINFER_KERNEL_FP8_GEMM=triton MATRIX_ARGS="--classes chat,reasoning --class-requests chat=96,reasoning=32 --async-overlap" REQS=96 RUNS=3 T_BUDGET=560 bash scripts/device_matrix.sh
#   a host that moves after calibration (16 busy loops from the calibration file on; run 58): does the issue probe track
#   the replays' eager issue?
#     HOST_LOAD=16 TWINFER_KERNEL_FP8_GEMM=triton MATRIX_ARGS="--classes chat,reasoning --class-requests chat=96,reasoning=32 --async-overlap" REQS=96 RUNS=3 T_BUDGET=560 bash scripts/device_matrix.sh
#   the beyond-grid probe (held-out chunk ops, decode and prompt steps past the grid's levels, and a prompt step right
#   after a long one; benchmarks/gpu/beyond_grid.py, read by benchmarks/beyond_grid_check.py) with the matrix
#   (run 65 at 7e2f7ed, H100: 551 s, the probe 28 s of it):
#     TWINFER_KERNEL_FP8_GEMM=triton MATRIX_ARGS="--classes longctx,summarize,agentic --max-model-len 16384 --class-requests summarize=96,agentic=96,longctx=24 --async-overlap --beyond-probe" REQS=96 RUNS=3 T_BUDGET=585 bash scripts/device_matrix.sh
# The device copies the working tree (tracked, untracked-not-ignored, carried) up to 64 MiB: pack a run's reports
# (reports.tgz, the calibration inside it) and repack them as xz before committing it
# (`python3 scripts/repack_reports.py RUN`: reports.tar.xz, 28% smaller; every archived run since 2026-12-07).
#   prefill-heavy + agentic on HEAD's model unchanged (run 17 at 0890110, Triton: 357 s):
#     TWINFER_KERNEL_FP8_GEMM=triton MATRIX_ARGS="--classes summarize,agentic --no-async-overlap" REQS=96 RUNS=3 T_BUDGET=370 bash scripts/device_matrix.sh
#   long decode + agentic, logits and sampler timed together (run 15):
#     MATRIX_ARGS="--classes reasoning,agentic --class-requests reasoning=32,agentic=96 --no-async-overlap" REQS=32 RUNS=3 T_BUDGET=530 bash scripts/device_matrix.sh
# Each unpacks with `tar xf reports.tar.xz` (as returned: `tar xzf reports.tgz`) in its run folder; `python3 scripts/matrix_offline.py RUN --sync` re-simulates.
# T_MATRIX bounds the python part (default: what is left of T_BUDGET=570 s since the script started, so install time
# counts; the packing after it takes seconds); the matrix file is rewritten after each class, so a time-out keeps the
# classes done.
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/env.txt"
# the board itself: H200s draw different power for the same work (issue 16, runs 43 vs 44: +35-45 W at equal work),
# which moves the clock the 700 W limit allows; which board a run had is part of its record
nvidia-smi --query-gpu=uuid,serial,vbios_version,power.limit,power.default_limit,clocks.max.sm --format=csv 2>&1 | tee -a "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/env.txt"
python3 -c "from kernels import registry; print('fa3', registry.probe_library('fa3')); print('flashmla', registry.probe_library('flashmla'))" | tee -a "$OUT/env.txt"
# dense FP8 GEMMs: the registry's choice (DeepGEMM where importable), what `serve` runs. Runs 1-15 and 17 set
# TWINFER_KERNEL_FP8_GEMM=triton (DeepGEMM JITs per shape); run 16 measured DeepGEMM: JIT warm-up 68 s, then 137 s of
# piecewise capture compiling the buckets the warm-up missed (fcfe884 adds them to the warm-up pool; not yet re-timed).
# TWINFER_KERNEL_FP8_GEMM=triton reproduces the earlier runs' engine.
if [ -n "${TWINFER_KERNEL_FP8_GEMM:-}" ]; then export TWINFER_KERNEL_FP8_GEMM; fi
echo "TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-(registry default)}" | tee -a "$OUT/env.txt"
# piecewise CUDA graphs (c39de4a, the engine's default) pad a prefill/mixed step's GEMM rows to a token bucket and
# replace its eager host floor; runs 1-9 measured the engine with them off, run 10 on (the default since run 10);
# TWINFER_PIECEWISE_GRAPHS=0 measures the old eager prefill path
export TWINFER_PIECEWISE_GRAPHS=${TWINFER_PIECEWISE_GRAPHS:-1}
echo "TWINFER_PIECEWISE_GRAPHS=$TWINFER_PIECEWISE_GRAPHS" | tee -a "$OUT/env.txt"
stage "first-call cost of a new masked SDPA shape, per backend (scripts/sdpa_first_call.py)"
timeout 60 python3 scripts/sdpa_first_call.py || echo "sdpa probe failed (rc $?)"
# background samplers for the whole matrix (stopped after it): every core's MHz (the host's speed drifted between and
# within runs 17-19: decode steps' host part -20..+20% against the model from one replay to the next) and the GPU's
# clocks, power and throttle reasons; both travel in reports.tgz
( while true; do echo "$(date +%s.%N | cut -c1-14) $(awk '/cpu MHz/ {printf "%d ", $4}' /proc/cpuinfo)"; sleep 0.5; done ) \
  > "$OUT/cpu_mhz.txt" 2>/dev/null &
MHZ_PID=$!
# and /proc/stat's aggregate CPU line (user nice system idle iowait irq softirq steal: a VM's stolen time shows in the
# last) with the core each python3 process last ran on (psr): run 20's decode host part switched between two speeds
# in blocks of a quarter-replay while every core read 2100 MHz and generation-2 collections were 1 a level
( while true; do echo "$(date +%s.%N | cut -c1-14) $(head -1 /proc/stat) | $(ps -o pid=,psr= -C python3 | tr -s ' \n' ' ')"; sleep 0.5; done ) \
  > "$OUT/cpu_stat.txt" 2>/dev/null &
STAT_PID=$!
REASONS=clocks_event_reasons.active
nvidia-smi --query-gpu=$REASONS --format=csv >/dev/null 2>&1 || REASONS=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,$REASONS --format=csv -lms 500 > "$OUT/gpu_clocks.csv" 2>&1 &
SMI_PID=$!
# HOST_LOAD=N: a host that moves between calibration and serving. Once the calibration file exists, N busy shell loops
# share the CPU with the engine until the matrix ends (the issue probe before each replay and the replays' own eager
# issue read the loaded host; the calibration read the quiet one). Off by default.
LOAD_PID=
if [ -n "${HOST_LOAD:-}" ]; then
  echo "HOST_LOAD=$HOST_LOAD busy loops after calibration (nproc $(nproc))" | tee -a "$OUT/env.txt"
  ( while ! ls "$OUT"/calibration_*.json >/dev/null 2>&1; do sleep 0.5; done
    echo "host load on at $(date +%s.%N | cut -c1-14)" >> "$OUT/env.txt"
    for _ in $(seq "$HOST_LOAD"); do ( while :; do :; done ) & done; wait ) &
  LOAD_PID=$!
fi
stage "validation matrix (scripts/device_matrix.py)"
T_MATRIX=${T_MATRIX:-$(( ${T_BUDGET:-570} - ($(date +%s) - T0) ))}
echo "time left for the matrix: ${T_MATRIX} s"
timeout ${T_MATRIX} python3 scripts/device_matrix.py --out "$OUT" --requests ${REQS:-48} --runs ${RUNS:-3} ${MATRIX_ARGS:-}
# the device returns at most 8 files from $OUT: the per-class reports and samples travel as one archive
# (run 4 lost two reports); unpack with `tar xzf reports.tgz` in the run's folder
kill "$MHZ_PID" "$STAT_PID" "$SMI_PID" 2>/dev/null
if [ -n "$LOAD_PID" ]; then pkill -P "$LOAD_PID" 2>/dev/null; kill "$LOAD_PID" 2>/dev/null; fi
( cd "$OUT" && ls validation_*.json samples_*.json >/dev/null 2>&1 \
  && tar czf reports.tgz validation_*.json samples_*.json $(ls cpu_mhz.txt cpu_stat.txt gpu_clocks.csv 2>/dev/null) \
  && rm -f validation_*.json samples_*.json cpu_mhz.txt cpu_stat.txt gpu_clocks.csv )
stage done
ls -la "$OUT"
