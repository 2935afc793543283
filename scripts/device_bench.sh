#!/usr/bin/env bash
# One device call (nvidia-h200): carried wheels + vendor kernels, GPU correctness tests,
# kernel micro-benchmarks, then workloads through `twinfer run` on CUDA. Everything lands
# in $OUT (8 files at most: the device tool's limit). Each stage has its own timeout so one
# hang cannot eat the call. Run from the repo root:  bash scripts/device_bench.sh
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
python3 -c "import torch, triton, pydantic; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'pydantic', pydantic.__version__, torch.cuda.get_device_name())"

stage "gpu tests"
timeout ${T_TESTS:-110} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py 2>&1 | tee "$OUT/pytest.txt" | tail -25

stage "kernel benchmarks"
timeout ${T_BENCH:-190} python3 -m benchmarks.gpu.bench_kernels --out "$OUT/bench.json" ${BENCH_ARGS:-}

if [ -z "${SKIP_KERNELS:-}" ]; then
  stage "twinfer kernels"
  timeout 30 python3 -m benchmarks.gpu.cli kernels --device cuda --json > "$OUT/kernels.json" || echo "kernels listing failed"
fi

export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each): benchmarked above, not in runs
stage "twinfer run tiny"
timeout ${T_TINY:-50} python3 -m benchmarks.gpu.cli run --model tiny --device cuda --dtype bf16 --requests 64 \
  --max-input-len 1024 --max-output-len 64 --rate 50 --draft-len 2 --num-kv-blocks 4096 \
  --step-log "$OUT/steps_tiny.jsonl" --out "$OUT/run_tiny.json"

stage "twinfer run deepseek-v3 (first 5 layers: 3 dense + 2 MoE, + MTP layer), fp8"
timeout ${T_DSV3:-150} python3 -m benchmarks.gpu.cli run --model deepseek-v3 --num-layers 5 --device cuda --dtype fp8 \
  --requests 32 --max-input-len 2048 --max-output-len 64 --rate 8 --max-num-seqs 64 --max-model-len 4096 \
  --step-log "$OUT/steps_dsv3.jsonl" --out "$OUT/run_dsv3.json"
if [ -n "${EXTRA_MTP:-}" ]; then   # the same model drafting 1 token per step with its MTP layer
  stage "twinfer run deepseek-v3 5 layers fp8, MTP draft 1"
  timeout ${T_MTP:-100} python3 -m benchmarks.gpu.cli run --model deepseek-v3 --num-layers 5 --device cuda --dtype fp8 \
    --requests 32 --max-input-len 2048 --max-output-len 64 --rate 8 --max-num-seqs 64 --max-model-len 4096 --draft-len 1 \
    --out "$OUT/run_dsv3_mtp.json"
fi
stage done
