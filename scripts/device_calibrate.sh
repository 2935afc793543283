#!/usr/bin/env bash
# One device call (nvidia-h200): a calibration alone of the engine the validation matrix serves (5-layer DeepSeek-V3
# FP8, Triton dense GEMMs, piecewise graphs, the matrix's 8192-token window and 128 sequences), written as
# $OUT/calibration_deepseek-v3-5layers_fp8.json, so that an archived matrix run's serving samples can be re-predicted
# on a calibration measured in another process (held out across runs): copy the run's folder, unpack its reports.tgz,
# put this calibration in place of its own, then scripts/matrix_offline.py / benchmarks/step_residuals.py on the copy.
# First, unless MOE_BENCH=0, the MoE's Triton block sizes beside the registry's DeepGEMM path in the same process
# (benchmarks/gpu/moe_block_m.py --deepgemm: where registry._FUSED_MOE_MIN_TOKENS belongs; issue 18).
# Run from the repo root with `.whl` carried:  bash scripts/device_calibrate.sh   (about 4 minutes: install 30 s, MoE
# bench with DeepGEMM JIT <= T_MOE (150 s), kernel JIT warm-up 25 s, calibration 95 s)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton} TWINFER_PIECEWISE_GRAPHS=${TWINFER_PIECEWISE_GRAPHS:-1}
echo "TWINFER_KERNEL_FP8_GEMM=$TWINFER_KERNEL_FP8_GEMM TWINFER_PIECEWISE_GRAPHS=$TWINFER_PIECEWISE_GRAPHS" | tee -a "$OUT/env.txt"
if [ "${MOE_BENCH:-1}" != 0 ]; then
  stage "MoE: Triton block sizes and the DeepGEMM path by token count (benchmarks/gpu/moe_block_m.py --deepgemm)"
  # the dense GEMM choice above is the serving engine's; the MoE bench forces each MoE path itself
  timeout ${T_MOE:-150} python3 -m benchmarks.gpu.moe_block_m "$OUT/moe_block_m.json" --deepgemm --blocks 16,64 \
    --tokens ${MOE_TOKENS:-256,512,1024,1536,2048,3072,4096,8192} --iters 20 || echo "moe bench: exit $?"
fi
stage "calibration (twinfer calibrate, the matrix's engine shape)"
timeout ${T_CALIB:-300} python3 -c "from ui.cli import main; main()" calibrate --model deepseek-v3 --num-layers 5 --dtype fp8 \
  --device cuda --max-model-len 8192 --max-num-seqs 128 --out "$OUT/calibration_deepseek-v3-5layers_fp8.json" \
  || echo "calibrate: exit $?"
stage done
ls -la "$OUT"
