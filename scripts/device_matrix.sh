#!/usr/bin/env bash
# One device call (nvidia-h200): the twin's validation matrix (issue 16) for ONE class set. Calibrate the 5-layer
# DeepSeek-V3 FP8 executor once, then validate the simulator on that one profile against the executor for the set's
# workload classes at three loads, each level replayed once unmeasured and then RUNS times (median).
# Run from the repo root with `.whl` carried:  bash scripts/device_matrix.sh
#
# Class sets the issue needs, one device call each (fits the 600 s call with install; times estimated from run 4's
# log at 96 requests: replay walls of one pass over the 3 levels agentic 32.8 s, summarize 45.1 s, reasoning 111 s,
# chat ~28 s (run 3 at 48 x 2); fixed part = install 10-60 s + JIT warm-up 12 s + calibration 81 s + step warm-up ~15 s):
#   chat + agentic (~400-450 s):
#     MATRIX_ARGS="--classes chat,agentic --no-async-overlap" REQS=96 RUNS=3 bash scripts/device_matrix.sh
#   prefill-heavy with shared prefixes (~330-380 s):
#     MATRIX_ARGS="--classes summarize --no-async-overlap" REQS=96 RUNS=3 bash scripts/device_matrix.sh
#   long decode (~420-470 s; 64 requests: 96 would need ~580 s):
#     MATRIX_ARGS="--classes reasoning --no-async-overlap" REQS=64 RUNS=3 bash scripts/device_matrix.sh
#   beyond the calibration grid, decode contexts 9-15k (~400-480 s, estimate from prefill rate; no earlier run):
#     MATRIX_ARGS="--classes longctx --max-model-len 16384 --no-async-overlap" REQS=32 RUNS=3 bash scripts/device_matrix.sh
# Each unpacks with `tar xzf reports.tgz` in its run folder; `python3 scripts/matrix_offline.py RUN --sync` re-simulates.
# T_MATRIX (default 530 s) bounds the python part; the matrix file is rewritten after each class, so a time-out keeps
# the classes done.
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" | tee -a "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each); the runs use Triton
stage "first-call cost of a new masked SDPA shape, per backend (scripts/sdpa_first_call.py)"
timeout 60 python3 scripts/sdpa_first_call.py || echo "sdpa probe failed (rc $?)"
stage "validation matrix (scripts/device_matrix.py)"
timeout ${T_MATRIX:-530} python3 scripts/device_matrix.py --out "$OUT" --requests ${REQS:-48} --runs ${RUNS:-3} ${MATRIX_ARGS:-}
# the device returns at most 8 files from $OUT: the per-class reports and samples travel as one archive
# (run 4 lost two reports); unpack with `tar xzf reports.tgz` in the run's folder
( cd "$OUT" && ls validation_*.json samples_*.json >/dev/null 2>&1 \
  && tar czf reports.tgz validation_*.json samples_*.json && rm -f validation_*.json samples_*.json )
stage done
ls -la "$OUT"
