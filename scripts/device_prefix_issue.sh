#!/usr/bin/env bash
# One device call (nvidia-h200), issue 16: a prompt chunk's forward issue on the host with its KV pages contiguous
# (as the calibration grid lays them) and scattered over the cache (as serving's are), with and without a cached
# prefix (benchmarks/gpu/prefix_issue_probe.py). Output: $OUT/prefix_issue.json, $OUT/env.txt, $OUT/log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_prefix_issue.sh     (about 2 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # runs 35-36's engine (DeepGEMM JIT-compiles ~160 s)
echo "TWINFER_KERNEL_FP8_GEMM=$TWINFER_KERNEL_FP8_GEMM" | tee -a "$OUT/env.txt"
stage "prompt chunk issue, pages contiguous vs scattered (benchmarks/gpu/prefix_issue_probe.py)"
timeout ${T_BENCH:-150} python3 -m benchmarks.gpu.prefix_issue_probe --out "$OUT/prefix_issue.json" --repeats ${REPEATS:-15} \
  || echo "prefix issue probe: exit $? (finished shapes are in the json)"
stage done
