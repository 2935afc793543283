#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18's eager host floor and piecewise CUDA graphs:
# 1. GPU tests of the piecewise graphs (captured pieces vs eager, the engine replaying them for prompt steps) and of
#    the decode graphs: $OUT/pytest_gpu.txt;
# 2. the 5-layer DeepSeek-V3 FP8 engine (executor.calibrate.build_engine, dummy weights; decode graphs and piecewise
#    graphs captured at engine start, their capture seconds and memory in eager.json "graphs") timed by step shape:
#    decode at b=1/8/64 as CUDA graph and eager; prefill of 64/512/2048/4096 tokens and two mixed steps (decodes next
#    to prompt chunks) eager and through the piecewise graphs, in the same process; each with its wall (execute:
#    inputs, forward, sampling), CUDA-event span, the forward's host issue time, host syncs (CUDA sync debug mode) and
#    dispatched torch ops; first the row-wise Triton kernels against the torch reference, the host microseconds of one
#    torch op / one Triton launch, and engine checks (MoE vs reference, decode graph vs eager, pieces vs eager).
# Output: $OUT/eager.json, $OUT/pytest_gpu.txt, $OUT/log.txt, $OUT/env.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_eager.sh     (<= 5 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each); the runs use Triton
stage "GPU tests: piecewise and decode graphs"
timeout ${T_TEST:-120} python3 -m pytest -q -m gpu --durations=8 tests/test_executor_piecewise.py tests/test_executor_cuda_graphs.py 2>&1 \
  | tail -40 | tee "$OUT/pytest_gpu.txt"
stage "eager vs graph vs piecewise steps (benchmarks/gpu/eager_host.py --engine)"
timeout ${T_EAGER:-170} python3 -m benchmarks.gpu.eager_host --engine --out "$OUT/eager.json" --repeats ${REPEATS:-10} \
  || echo "eager bench: exit $? (what finished is in eager.json)"
stage done
