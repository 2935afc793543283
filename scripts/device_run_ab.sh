#!/usr/bin/env bash
# One device call (nvidia-h200): `twinfer run` on the 5-layer DeepSeek-V3 FP8 engine (Triton GEMMs) twice in one call,
# the Triton FP8 GEMM with its untuned tiles (TWINFER_TRITON_GEMM_CONFIGS=off) and with the committed tuned table
# (kernels/configs/triton_fp8_gemm.json): output tokens/s, TPOT and ITL of the same chat workload at up to 64 running
# requests. Output: $OUT/run_off.json, $OUT/run_tuned.json, $OUT/env.txt, $OUT/log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_run_ab.sh     (<= 4 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=triton
for tag in off tuned; do
  stage "twinfer run, Triton FP8 GEMM tiles: $tag"
  if [ "$tag" = off ]; then export TWINFER_TRITON_GEMM_CONFIGS=off; else unset TWINFER_TRITON_GEMM_CONFIGS; fi
  timeout ${T_RUN:-120} python3 -c "from ui.cli import main; main()" run -m deepseek-v3 --num-layers 5 --device cuda --dtype fp8 -w chat \
    -n ${REQS:-256} --rate 1000 --max-num-seqs 64 --max-input-len 512 --max-output-len 128 --max-model-len 1024 --no-async-overlap \
    -o "$OUT/run_$tag.json" || echo "run $tag: exit $?"
done
stage done
