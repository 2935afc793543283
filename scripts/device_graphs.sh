#!/usr/bin/env bash
# One device call (nvidia-h200): CUDA graphs for decode steps (executor/cuda_graphs.py).
# GPU tests (graph greedy tokens == eager), then DeepSeek-V3 first 5 layers FP8 dummy weights:
# median decode step time by batch size, eager vs graphs (scripts/device_graphs.py), then a short
# `twinfer run` with graphs on and its step log. Run from the repo root with `.whl` carried.
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/env.txt"
date -u +%Y-%m-%dT%H:%M:%SZ >> "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each)

stage "bench: deepseek-v3 5 layers fp8, decode step eager vs graphs"
timeout ${T_BENCH:-200} python3 scripts/device_graphs.py "$OUT/graphs_bench.json"

stage "gpu tests"
timeout ${T_TESTS:-100} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_executor_cuda_graphs.py 2>&1 | tee "$OUT/pytest.txt" | tail -15

stage "twinfer run deepseek-v3 5 layers fp8, graphs on"
timeout ${T_RUN:-90} python3 -m benchmarks.gpu.cli run --model deepseek-v3 --num-layers 5 --device cuda --dtype fp8 \
  --requests 32 --max-input-len 512 --max-output-len 32 --rate 50 --max-num-seqs 64 --max-model-len 2048 --no-warmup \
  --step-log "$OUT/steps_graphs.jsonl" --out "$OUT/run_graphs.json" | tail -20
stage done
ls -la "$OUT"
