#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18's eager host floor: the 5-layer DeepSeek-V3 FP8 engine
# (executor.calibrate.build_engine, dummy weights) timed by step shape: decode at b=1/8/64 as CUDA graph and eager,
# eager prefill of 64/512/4096 tokens, two mixed steps (decodes next to prompt chunks), each with its wall (execute:
# inputs, forward, sampling), CUDA-event span, the forward's host issue time, host syncs (CUDA sync debug mode) and
# dispatched torch ops per layer; then three eager shapes again with the row-wise ops (RMSNorm, FP8 activation
# quantisation, RoPE, SiLU-and-mul) as torch ops, as before the fix; first the row-wise Triton kernels against the
# torch reference and the host microseconds of one torch op / one Triton launch. Output: $OUT/eager.json, $OUT/log.txt, $OUT/env.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_eager.sh     (<= 4 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each); the runs use Triton
stage "eager vs graph steps (benchmarks/gpu/eager_host.py --engine)"
timeout ${T_EAGER:-210} python3 -m benchmarks.gpu.eager_host --engine --out "$OUT/eager.json" --repeats ${REPEATS:-10} \
  || echo "eager bench: exit $? (what finished is in eager.json)"
stage done
