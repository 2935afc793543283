#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18's MLA prefill-chunk attention: the flash split + LSE merge
# (kernels/prefill_attention.py, the registry's new `flash` impl of attention_prefill) against the pinned
# memory-efficient SDPA (the path before it), cuDNN and math, and one FlashAttention-2 call with bottom-right causal
# (`flash_direct`, checked, not used), at 64x0, 1000x3000, 4096x0, 517x5003 (new x cached; 128 heads, q/k 192, v 128,
# bf16): first-call wall ms, steady device ms (CUDA events, median), rel error vs reference.attention; then 4 shapes
# never seen per variant (what a new shape costs) and the split's parts alone. First the GPU tests (flash split vs the
# reference at those shapes, no host sync; its Triton LSE merge vs the torch one; the tiny CUDA engine vs its one-shot
# forward, whose short unmasked chunks now run the split).
# Output: $OUT/attn_prefill.json, $OUT/pytest.txt, $OUT/log.txt, $OUT/env.txt.
# Run from the repo root (no wheels needed; .whl is used if carried):  bash scripts/device_attn.sh   (~2 minutes)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name(), 'flash available', torch.backends.cuda.is_flash_attention_available())"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; git status --short kernels benchmarks tests executor 2>/dev/null | head; } | tee "$OUT/env.txt"

stage "gpu tests: flash split prefill attention, tiny engine on CUDA"
timeout ${T_TESTS:-60} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py \
  -k "flash_split or attn_merge or tiny_engine" 2>&1 | tee "$OUT/pytest.txt" | tail -15

stage "prefill attention: flash split vs mem-efficient / cuDNN / math (benchmarks/gpu/attn_prefill_bench.py)"
timeout ${T_BENCH:-100} python3 -m benchmarks.gpu.attn_prefill_bench "$OUT/attn_prefill.json" \
  --shapes ${SHAPES:-64x0,1000x3000,4096x0,517x5003} --iters ${ITERS:-20} --new-shapes ${NEW_SHAPES:-4} \
  || echo "attn bench: exit $? (what finished is in attn_prefill.json)"
stage done
