#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18: the DeepGEMM engine (the registry's default FP8 GEMM) serving prompt steps
# past the largest piecewise bucket (4096 tokens) at row counts the engine never ran, to check the warm-up of stop 35
# (kernels.warmup.eager_gemm_rows: the dense FP8 GEMMs at every multiple of 64 rows up to the step budget). Run 19 hit
# one 3,438 ms step (a mid-run DeepGEMM compile at 5719 tokens) where ~63 ms was due.
# `twinfer run` with the summarize preset (prompts of several thousand tokens) and a step budget of 8192 tokens, with a
# step log; then every step group and the one-off slow steps (benchmarks/gpu/run_ab_steps.py): a compile shows as a
# prompt step many times its group's median. The engine start (the DeepGEMM nvcc pool, ~160 s for 576 shapes in run 19,
# now with the eager rows) is in the log.
# Output: $OUT/run_deepgemm.json, $OUT/steps_deepgemm.jsonl, $OUT/env.txt, $OUT/log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_deepgemm_serve.sh     (<= 10 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -c "from kernels import registry; print('deepgemm', registry.probe_library('deepgemm'))"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
unset TWINFER_KERNEL_FP8_GEMM
stage "twinfer run on DeepGEMM, prompt steps past 4096 tokens"
timeout ${T_RUN:-540} python3 -c "from ui.cli import main; main()" run -m deepseek-v3 --num-layers 5 --device cuda --dtype fp8 \
  -w summarize -n ${REQS:-64} --rate 1000 --max-num-seqs 64 --max-batched-tokens 8192 --max-model-len 16384 --no-async-overlap \
  --step-log "$OUT/steps_deepgemm.jsonl" -o "$OUT/run_deepgemm.json" || echo "run: exit $?"
stage "step groups and one-off slow steps"
python3 -m benchmarks.gpu.run_ab_steps "$OUT/steps_deepgemm.jsonl" --labels deepgemm || echo "run_ab_steps: exit $?"
stage done
