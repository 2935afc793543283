#!/usr/bin/env bash
# One device call (nvidia-h200): `twinfer run` on the 5-layer DeepSeek-V3 FP8 engine (Triton GEMMs) in passes that
# alternate the Triton FP8 GEMM's untuned tiles (TWINFER_TRITON_GEMM_CONFIGS=off) and the committed tuned table
# (kernels/configs/triton_fp8_gemm.json), same chat workload at up to 64 running requests, each pass with a step log.
# ORDER (default "off tuned tuned off": each setting once first and once last, so warm-GPU order effects cancel).
# Output: $OUT/run_<i>_<tag>.json, $OUT/steps_<i>_<tag>.jsonl, $OUT/env.txt, $OUT/log.txt; then the step groups of
# every pass against the first (benchmarks/gpu/run_ab_steps.py) in the log. Run 1 (run_ab_a8c4f80) had one pass each,
# fixed order, no step log.
# Run from the repo root with `.whl` carried:  bash scripts/device_run_ab.sh     (<= 5 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=triton
i=0; logs=(); labels=()
for tag in ${ORDER:-off tuned tuned off}; do
  i=$((i + 1))
  stage "twinfer run $i, Triton FP8 GEMM tiles: $tag"
  if [ "$tag" = off ]; then export TWINFER_TRITON_GEMM_CONFIGS=off; else unset TWINFER_TRITON_GEMM_CONFIGS; fi
  timeout ${T_RUN:-110} python3 -c "from ui.cli import main; main()" run -m deepseek-v3 --num-layers 5 --device cuda --dtype fp8 -w chat \
    -n ${REQS:-256} --rate 1000 --max-num-seqs 64 --max-input-len 512 --max-output-len 128 --max-model-len 1024 --no-async-overlap \
    --step-log "$OUT/steps_${i}_$tag.jsonl" -o "$OUT/run_${i}_$tag.json" || echo "run $i $tag: exit $?"
  logs+=("$OUT/steps_${i}_$tag.jsonl"); labels+=("${i}_$tag")
done
stage "step groups against the first pass (benchmarks/gpu/run_ab_steps.py)"
python3 -m benchmarks.gpu.run_ab_steps "${logs[@]}" --labels "$(IFS=,; echo "${labels[*]}")" || echo "run_ab_steps: exit $?"
stage done
