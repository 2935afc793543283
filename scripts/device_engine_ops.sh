#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18: (1) every op the 5-layer DeepSeek-V3 FP8 engine runs, the registry's choice
# against every other usable implementation in this process, at decode (M <= 128) and prefill (M >= 4096) shapes
# (benchmarks/gpu/engine_ops.py: the >= 0.9x-of-best table); (2) `twinfer run` end to end on the registry's default
# kernels (DeepGEMM dense GEMMs, the fused DeepGEMM MoE at >= 1024 tokens) against Triton GEMMs and MoE, same chat
# workload, passes in ORDER (default "default triton triton default": each setting once first and once last), each
# with a step log, then the step groups against the first pass. The step budget is 4096 tokens so DeepGEMM's start
# compiles the buckets only (the 8192 budget adds 576 eager row counts: 189 s of pool, deepgemm_serve2_3955d31).
# Output: $OUT/engine_ops.json, $OUT/run_<i>_<tag>.json, $OUT/steps_<i>_<tag>.jsonl, $OUT/env.txt, $OUT/log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_engine_ops.sh     (<= 8 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -c "from kernels import registry; [print(k, registry.probe_library(k)[:2]) for k in ('deepgemm', 'flashmla', 'fa3')]"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
unset TWINFER_KERNEL_FP8_GEMM TWINFER_KERNELS
stage "engine ops: the registry's choice against every usable implementation"
timeout ${T_OPS:-240} python3 -m benchmarks.gpu.engine_ops --out "$OUT/engine_ops.json" ${OPS_ARGS:-} || echo "engine ops: exit $?"
i=0; logs=(); labels=()
for tag in ${ORDER:-default triton triton default}; do
  i=$((i + 1))
  stage "twinfer run $i, kernels: $tag"
  if [ "$tag" = triton ]; then export TWINFER_KERNELS="fp8_gemm=triton,moe_experts=triton"; else unset TWINFER_KERNELS; fi
  timeout ${T_RUN:-150} python3 -c "from ui.cli import main; main()" run -m deepseek-v3 --num-layers 5 --device cuda --dtype fp8 -w chat \
    -n ${REQS:-256} --rate 1000 --max-num-seqs 64 --max-input-len 512 --max-output-len 128 --max-model-len 1024 \
    --max-batched-tokens 4096 --no-async-overlap --step-log "$OUT/steps_${i}_$tag.jsonl" -o "$OUT/run_${i}_$tag.json" \
    || echo "run $i $tag: exit $?"
  logs+=("$OUT/steps_${i}_$tag.jsonl"); labels+=("${i}_$tag")
done
stage "step groups against the first pass (benchmarks/gpu/run_ab_steps.py)"
python3 -m benchmarks.gpu.run_ab_steps "${logs[@]}" --labels "$(IFS=,; echo "${labels[*]}")" || echo "run_ab_steps: exit $?"
stage done
