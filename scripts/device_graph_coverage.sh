#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18's "no decode path stays eager": DSA models and MTP drafting through the
# piecewise CUDA graphs.
# 1. GPU tests of the piecewise graphs (captured pieces vs eager: dense MLA, DSA shapes past the indexer's top-k, MTP
#    draft pieces) and of the decode graphs: $OUT/pytest_gpu.txt;
# 2. benchmarks/gpu/graph_coverage.py: 5-layer DeepSeek-V3.2 FP8 (DSA) decode / prefill / mixed steps eager vs pieces,
#    and the 5-layer DeepSeek-V3 FP8 MTP layer's draft forward eager vs its two pieces: $OUT/graph_coverage.json.
# Run from the repo root with `.whl` carried:  bash scripts/device_graph_coverage.sh     (<= 6 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each); the runs use Triton
echo "TWINFER_KERNEL_FP8_GEMM=$TWINFER_KERNEL_FP8_GEMM" | tee -a "$OUT/env.txt"
stage "GPU tests: piecewise (dense, DSA, MTP pieces) and decode graphs"
timeout ${T_TEST:-200} python3 -m pytest -q -m gpu --durations=8 tests/test_executor_piecewise.py tests/test_executor_cuda_graphs.py 2>&1 \
  | tail -40 | tee "$OUT/pytest_gpu.txt"
stage "DSA and MTP steps, eager vs pieces (benchmarks/gpu/graph_coverage.py)"
timeout ${T_BENCH:-300} python3 -m benchmarks.gpu.graph_coverage --out "$OUT/graph_coverage.json" --repeats ${REPEATS:-30} \
  || echo "graph coverage bench: exit $? (what finished is in graph_coverage.json)"
stage done
