#!/usr/bin/env bash
# One device call (nvidia-h200): the twin's validation matrix (issue 16). Calibrate the 5-layer DeepSeek-V3
# FP8 executor once, then validate the simulator on that one profile against the executor for four workload
# classes (chat, summarize, reasoning, agentic) at three loads, each level replayed three times (median).
# Run from the repo root with `.whl` carried:  bash scripts/device_matrix.sh
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each); the runs use Triton
stage "validation matrix (scripts/device_matrix.py)"
timeout ${T_MATRIX:-540} python3 scripts/device_matrix.py --out "$OUT" --requests ${REQS:-48} --runs ${RUNS:-3} ${MATRIX_ARGS:-}
# the device returns at most 8 files from $OUT: the per-class reports and samples travel as one archive
# (run 4 lost two reports); unpack with `tar xzf reports.tgz` in the run's folder
( cd "$OUT" && ls validation_*.json samples_*.json >/dev/null 2>&1 \
  && tar czf reports.tgz validation_*.json samples_*.json && rm -f validation_*.json samples_*.json )
stage done
ls -la "$OUT"
