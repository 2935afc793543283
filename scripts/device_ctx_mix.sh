#!/usr/bin/env bash
# One device call (nvidia-h200): (1) issue 16, decode steps at one batch and mean context with the contexts spread and
# the KV pages scattered as serving has them, against the grid's equal contexts on pages in order
# (benchmarks/gpu/decode_ctx_mix.py; the matrix runs' engine, Triton GEMMs); (2) issue 18, the registry's decode-row
# FP8 GEMM choice re-measured after the narrow-weight rule (benchmarks/gpu/engine_ops.py, GEMM section, 64 and 128
# rows; registry default kernels); (3) the GPU kernel tests.
# Output: $OUT/ctx_mix.json, $OUT/engine_ops_gemm.json, $OUT/pytest_gpu.txt, $OUT/env.txt, $OUT/log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_ctx_mix.sh     (<= 5 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
stage "decode steps: contexts spread, pages scattered (benchmarks/gpu/decode_ctx_mix.py, Triton GEMMs)"
TWINFER_KERNEL_FP8_GEMM=triton timeout ${T_MIX:-150} python3 -m benchmarks.gpu.decode_ctx_mix --out "$OUT/ctx_mix.json" \
  --batches ${BATCHES:-4,16,64} --ctx ${CTX:-512,2048} --rounds ${ROUNDS:-3} || echo "ctx mix: exit $?"
stage "engine ops, FP8 GEMMs at decode rows (registry default)"
timeout ${T_OPS:-120} python3 -m benchmarks.gpu.engine_ops --out "$OUT/engine_ops_gemm.json" --sections gemm --rows 64,128 \
  || echo "engine ops: exit $?"
stage "gpu tests"
timeout ${T_TESTS:-120} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15
stage done
