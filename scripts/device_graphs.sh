#!/usr/bin/env bash
# One device call (nvidia-h200): CUDA graphs for decode steps (executor/cuda_graphs.py).
# GPU tests (graph greedy tokens == eager), then DeepSeek-V3 first 5 layers FP8 dummy weights:
# median decode step time by batch size, eager vs graphs (scripts/device_graphs.py), then a short
# `twinfer run` with graphs on and its step log. Run from the repo root with `.whl` carried.
set -u
OUT=${OUT:-/tmp/twinfer_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
T0=$(date +%s)
stage() { echo; echo "=== $1 (t=$(( $(date +%s) - T0 ))s)"; }

stage install
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || echo "wheel install failed"
fi
if [ -f .whl/vllm_vendor_extract.tar.gz ]; then
  mkdir -p /tmp/vendor && tar xzf .whl/vllm_vendor_extract.tar.gz -C /tmp/vendor
fi
export PYTHONPATH="$PWD:/tmp/site:/tmp/vendor"
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
  --step-log "$OUT/steps_graphs.jsonl" --json "$OUT/run_graphs.json" | tail -20
stage done
ls -la "$OUT"
