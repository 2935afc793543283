#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18's MLA prefill-chunk attention: FlashAttention-3 (vLLM's sm90 build, the
# registry's first choice for attention_prefill where it loads: kernels.vendor.fa3_prefill, one varlen call, bottom-right
# causal, v at 128) and the flash split + LSE merge (kernels/prefill_attention.py, the fallback) against the pinned
# memory-efficient SDPA, cuDNN and math, and one FlashAttention-2 call with bottom-right causal (`flash_direct`,
# checked, not used), at 64x0, 1000x3000, 4096x0, 517x5003, 8192x0, 2048x6144 (new x cached; 128 heads, q/k 192, v 128,
# bf16): first-call wall ms, steady device ms (CUDA events, median), rel error vs reference.attention, each as a
# fraction of the fastest; then 4 shapes never seen per variant (what a new shape costs) and the split's parts alone.
# First the GPU kernel tests (every vendor/Triton path vs the torch reference: tests/test_kernels_gpu.py, including
# FA3 and the flash split at those shapes with no host sync, the tiny CUDA engine vs its one-shot forward).
# Output: $OUT/attn_prefill.json, $OUT/pytest.txt, $OUT/log.txt, $OUT/env.txt.
# Run from the repo root with `.whl` carried (FA3 comes in the vendor extract: bash scripts/build_vendor_extract.sh):
#   bash scripts/device_attn.sh   (~4 minutes; T_TESTS bounds the tests, T_BENCH the bench)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name(), 'flash available', torch.backends.cuda.is_flash_attention_available())"
  python3 -c "from kernels import registry; print('fa3', registry.probe_library('fa3'))"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; git status --short kernels benchmarks tests executor 2>/dev/null | head; } | tee "$OUT/env.txt"

stage "gpu tests: every kernel path vs the reference (tests/test_kernels_gpu.py)"
timeout ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py ${TEST_K:+-k "$TEST_K"} \
  2>&1 | tee "$OUT/pytest.txt" | tail -25

stage "prefill attention: FA3 and the flash split vs mem-efficient / cuDNN / math (benchmarks/gpu/attn_prefill_bench.py)"
timeout ${T_BENCH:-200} python3 -m benchmarks.gpu.attn_prefill_bench "$OUT/attn_prefill.json" \
  --shapes ${SHAPES:-64x0,1000x3000,4096x0,517x5003,8192x0,2048x6144} --iters ${ITERS:-20} --new-shapes ${NEW_SHAPES:-4} \
  || echo "attn bench: exit $? (what finished is in attn_prefill.json)"
stage done
