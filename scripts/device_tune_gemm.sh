#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18's tuned Triton FP8 GEMM:
# 1. GPU tests of the Triton FP8 GEMM (default tiles, every tile shape and split-K the tuner may pick) and DeepGEMM's
#    against the reference: $OUT/pytest_gpu.txt;
# 2. benchmarks/gpu/tune_fp8_gemm.py: tiles per (N, K, M) for DeepSeek-V3's FP8 GEMMs on this GPU:
#    $OUT/triton_fp8_gemm.json (the table kernels.gemm_tuning reads) and $OUT/tune_fp8_gemm.csv (untuned vs tuned);
# 3. the committed dense op table's rows again, Triton with the tuned table beside DeepGEMM in the same process
#    (benchmarks/gpu/op_tables.py --tables dense): $OUT/dense_gemm_fp8.csv, $OUT/provenance.json.
# Run from the repo root with `.whl` carried:  bash scripts/device_tune_gemm.sh     (<= 9.5 minutes with the install;
# tune_fp8_gemm_226f96e: tests 40 s, tuner 256 s, and the dense op table needs ~200 s: its 150 s cut it short)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
stage "GPU tests: FP8 GEMMs (Triton tiles and split-K, DeepGEMM)"
timeout ${T_TEST:-150} python3 -m pytest -q -m gpu tests/test_kernels_gpu.py -k "fp8_gemm" 2>&1 | tail -25 | tee "$OUT/pytest_gpu.txt"
stage "tune the Triton FP8 GEMM (benchmarks/gpu/tune_fp8_gemm.py)"
timeout ${T_TUNE:-280} python3 -m benchmarks.gpu.tune_fp8_gemm --out-dir "$OUT" ${TUNE_ARGS:-} || echo "tuner: exit $?"
stage "dense op table: Triton with the tuned tiles beside DeepGEMM"
if [ -f "$OUT/triton_fp8_gemm.json" ]; then
  TWINFER_TRITON_GEMM_CONFIGS="$OUT/triton_fp8_gemm.json" timeout ${T_TABLES:-230} \
    python3 -m benchmarks.gpu.op_tables --out-dir "$OUT" --tables dense || echo "op tables: exit $?"
fi
stage done
