#!/usr/bin/env bash
# One device call (nvidia-h200), issue 18's MoE layer at prefill: the fused DeepGEMM path with its layout work as one
# Triton launch per step (kernels/triton_moe_layout.py: permute+quantise, SiLU+requantise, combine) against the same
# path with torch glue, the Triton MoE and DeepGEMM's two grouped GEMMs alone, at 64/512/4096/8192 tokens; each layout
# step alone; the GEMMs on the rows actually used (what the no-sync row bound costs) and at DeepGEMM's alignment 64.
# First the GPU tests of the layout kernels and the fused path (bit-equal permute quantisation, SiLU/combine, fused vs
# reference.moe_experts, graph capture of both layouts). Output: $OUT/moe_layout.json, $OUT/pytest.txt, $OUT/log.txt,
# $OUT/env.txt. Run from the repo root with `.whl` carried:  bash scripts/device_moe.sh   (<= 4 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; git status --short kernels benchmarks tests 2>/dev/null | head; } | tee "$OUT/env.txt"

stage "gpu tests: MoE layout kernels and the fused DeepGEMM path"
timeout ${T_TESTS:-60} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py \
  -k "triton_moe_permute or triton_moe_silu or triton_moe_layouts or fused_moe" 2>&1 | tee "$OUT/pytest.txt" | tail -15

stage "MoE layer: fused (Triton glue / torch glue) vs Triton MoE vs GEMMs alone (benchmarks/gpu/moe_layout_bench.py)"
timeout ${T_BENCH:-140} python3 -m benchmarks.gpu.moe_layout_bench "$OUT/moe_layout.json" --tokens ${TOKENS:-64,512,4096,8192} \
  --iters ${ITERS:-20} ${NO_ALIGN64:+--no-align64} || echo "moe bench: exit $? (what finished is in moe_layout.json)"
stage done
