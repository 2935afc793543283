#!/usr/bin/env bash
# One device call (nvidia-h200), stages picked by STAGES (comma list, run in this order):
#   tests    GPU kernel tests (-m gpu tests/test_kernels_gpu.py)
#   serving  benchmarks.gpu.serving_step: vendor paths vs reference, fused MoE vs Triton, 5-layer
#            DeepSeek-V3 FP8 decode step B=64 ctx 4k with DeepGEMM vs Triton (issue 18)
#   bench    benchmarks.gpu.bench_kernels micro-benchmarks (BENCH_ARGS)
#   kernels  `twinfer kernels --device cuda --json`
#   run64    `twinfer run` 5-layer DeepSeek-V3 FP8 at batch 64 (RUN_OVERRIDES=triton: Triton GEMMs/MoE)
#   tiny, dsv3  the older workload runs
# Everything lands in $OUT. Each stage has its own timeout so one hang cannot eat the call.
# Run from the repo root:  STAGES=tests,serving,kernels,run64 bash scripts/device_bench.sh
source scripts/device_env.sh
STAGES=",${STAGES:-tests,serving,kernels,run64},"
has() { [[ "$STAGES" == *",$1,"* ]]; }
export TWINFER_CACHE_DIR=${TWINFER_CACHE_DIR:-/tmp/twinfer_cache}   # DeepGEMM JIT cache shared by all stages
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; echo "STAGES=$STAGES"; } | tee "$OUT/env.txt"

if has tests; then
  stage "gpu tests"
  timeout ${T_TESTS:-75} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py 2>&1 | tee "$OUT/pytest.txt" | tail -25
fi
if has serving; then
  stage "serving step: vendor vs reference, fused MoE, 5-layer decode step DeepGEMM vs Triton"
  timeout ${T_SERVING:-200} python3 -m benchmarks.gpu.serving_step "$OUT/serving_step.json" ${SERVING_ARGS:-}
  ls -la "$TWINFER_CACHE_DIR/deepgemm" 2>/dev/null | head -5; du -sh "$TWINFER_CACHE_DIR" 2>/dev/null
fi
if has bench; then
  stage "kernel benchmarks"
  timeout ${T_BENCH:-190} python3 -m benchmarks.gpu.bench_kernels --out "$OUT/bench.json" ${BENCH_ARGS:-}
fi
if has kernels; then
  stage "twinfer kernels"
  timeout 30 python3 -m benchmarks.gpu.cli kernels --device cuda --json > "$OUT/kernels.json" || echo "kernels listing failed"
fi
if has run64; then
  tag=${RUN_OVERRIDES:-deepgemm}
  [ "$tag" = triton ] && export TWINFER_KERNELS="fp8_gemm=triton,moe_experts=triton"
  stage "twinfer run deepseek-v3 5 layers fp8, batch 64 ($tag)"
  timeout ${T_RUN:-90} python3 -m benchmarks.gpu.cli run --model deepseek-v3 --num-layers 5 --device cuda --dtype fp8 \
    --requests 64 --max-input-len 512 --max-output-len 128 --rate 1000 --max-num-seqs 64 --max-model-len 1024 \
    --step-log "$OUT/steps_run64_$tag.jsonl" --out "$OUT/run64_$tag.json" | tail -25
  unset TWINFER_KERNELS
fi
if has tiny; then
  stage "twinfer run tiny"
  timeout ${T_TINY:-50} python3 -m benchmarks.gpu.cli run --model tiny --device cuda --dtype bf16 --requests 64 \
    --max-input-len 1024 --max-output-len 64 --rate 50 --draft-len 2 --num-kv-blocks 4096 \
    --step-log "$OUT/steps_tiny.jsonl" --out "$OUT/run_tiny.json"
fi
if has dsv3; then
  stage "twinfer run deepseek-v3 (first 5 layers: 3 dense + 2 MoE, + MTP layer), fp8"
  timeout ${T_DSV3:-150} python3 -m benchmarks.gpu.cli run --model deepseek-v3 --num-layers 5 --device cuda --dtype fp8 \
    --requests 32 --max-input-len 2048 --max-output-len 64 --rate 8 --max-num-seqs 64 --max-model-len 4096 \
    --step-log "$OUT/steps_dsv3.jsonl" --out "$OUT/run_dsv3.json"
fi
stage done
ls -la "$OUT"
