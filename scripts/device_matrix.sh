#!/usr/bin/env bash
# One device call (nvidia-h200): the twin's validation matrix (issue 16) for ONE class set. Calibrate the 5-layer
# DeepSeek-V3 FP8 executor once, then validate the simulator on that one profile against the executor for the set's
# workload classes at three loads, each level replayed once unmeasured and then RUNS times (median).
# Run from the repo root with `.whl` carried:  bash scripts/device_matrix.sh
#
# Class sets the issue needs, one device call each, under the 600 s call with install. Estimated from run 4's log at
# 96 requests: one pass over the 3 levels takes agentic 32.8 s, summarize 45.1 s, reasoning 111 s (74 s at 64), chat
# ~28 s (run 3: 13.8 s at 48); each level runs 1 unmeasured + RUNS measured passes (4 with RUNS=3; the class-wide
# warm-up replay is then skipped). Fixed part ~100 s (JIT warm-up 12 s and calibration 69 s as in run 4, step
# warm-up ~15 s, SDPA probe ~5 s) plus install 10-60 s. Prefill attention now runs the memory-efficient kernel,
# not cuDNN: prefill-heavy sets may take up to ~20% longer than run 4's walls.
#   chat + agentic (~360-410 s):
#     MATRIX_ARGS="--classes chat,agentic --no-async-overlap" REQS=96 RUNS=3 bash scripts/device_matrix.sh
#   prefill-heavy with shared prefixes (~290-380 s; run 5 at 646970b took 295 s: calibration 96 s, the class 176 s):
#     MATRIX_ARGS="--classes summarize --no-async-overlap" REQS=96 RUNS=3 bash scripts/device_matrix.sh
#   long decode (~400-460 s; 96 requests would need ~600 s):
#     MATRIX_ARGS="--classes reasoning --no-async-overlap" REQS=64 RUNS=3 bash scripts/device_matrix.sh
#   beyond the calibration grid: prompts 8.5-12k, decodes at 8.5-12k context (~400-470 s; from the calibration's
#   prefill rate, no earlier run; attention grows with the square of the prompt):
#     MATRIX_ARGS="--classes longctx --max-model-len 16384 --no-async-overlap" REQS=24 RUNS=3 bash scripts/device_matrix.sh
# Each unpacks with `tar xzf reports.tgz` in its run folder; `python3 scripts/matrix_offline.py RUN --sync` re-simulates.
# T_MATRIX bounds the python part (default: what is left of T_BUDGET=570 s since the script started, so install time
# counts; the packing after it takes seconds); the matrix file is rewritten after each class, so a time-out keeps the
# classes done.
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each); the runs use Triton
# piecewise CUDA graphs (c39de4a, on by default) pad a prefill/mixed step's GEMM rows to a token bucket and replace its
# eager host floor; the step model prices the padding when the profile records the buckets (4d27601), but no matrix
# has measured it yet, so the matrix keeps runs 1-5's engine by default. TWINFER_PIECEWISE_GRAPHS=1 measures the new default.
export TWINFER_PIECEWISE_GRAPHS=${TWINFER_PIECEWISE_GRAPHS:-0}
echo "TWINFER_PIECEWISE_GRAPHS=$TWINFER_PIECEWISE_GRAPHS" | tee -a "$OUT/env.txt"
stage "first-call cost of a new masked SDPA shape, per backend (scripts/sdpa_first_call.py)"
timeout 60 python3 scripts/sdpa_first_call.py || echo "sdpa probe failed (rc $?)"
stage "validation matrix (scripts/device_matrix.py)"
T_MATRIX=${T_MATRIX:-$(( ${T_BUDGET:-570} - ($(date +%s) - T0) ))}
echo "time left for the matrix: ${T_MATRIX} s"
timeout ${T_MATRIX} python3 scripts/device_matrix.py --out "$OUT" --requests ${REQS:-48} --runs ${RUNS:-3} ${MATRIX_ARGS:-}
# the device returns at most 8 files from $OUT: the per-class reports and samples travel as one archive
# (run 4 lost two reports); unpack with `tar xzf reports.tgz` in the run's folder
( cd "$OUT" && ls validation_*.json samples_*.json >/dev/null 2>&1 \
  && tar czf reports.tgz validation_*.json samples_*.json && rm -f validation_*.json samples_*.json )
stage done
ls -la "$OUT"
