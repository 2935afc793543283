#!/usr/bin/env bash
# One device call (nvidia-h200), issue 16: the prompt step's launch host work, then the validation matrix on it.
# 1. benchmarks/gpu/prompt_launch.py: the 5-layer DeepSeek-V3 FP8 engine (registry kernels: DeepGEMM dense GEMMs,
#    FlashMLA, FA3), prompt-bearing steps through the piecewise graphs with the attention before and after the
#    per-step sharing, interleaved in one process: host issue time, its split, the hidden states' difference, and a
#    cProfile of the current forward ($OUT/prompt_launch.json). Its DeepGEMM JIT warms the cache the matrix reuses.
#    Also a decode step through its CUDA graph (captured with the current attention) against the attention before.
# 2. unless the two attentions disagree (hidden max difference over 5% of the largest value), the matrix:
#    MATRIX_ARGS / REQS / RUNS as scripts/device_matrix.sh takes them, with what is left of T_BUDGET (default 575 s).
# Run from the repo root with `.whl` carried:
#   MATRIX_ARGS="--classes summarize,agentic --class-requests summarize=96,agentic=96 --async-overlap" REQS=96 RUNS=3 \
#     bash scripts/device_prompt_launch.sh
source scripts/device_env.sh
T_START=$T0
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/launch_env.txt"
stage "prompt-step launch: attention before vs now (benchmarks/gpu/prompt_launch.py)"
timeout ${T_LAUNCH:-240} python3 -m benchmarks.gpu.prompt_launch --out "$OUT/prompt_launch.json" --repeats ${LAUNCH_REPEATS:-30} \
  || echo "prompt_launch: exit $?"
OK=$(python3 -c "
import json, sys
try:
    r = json.load(open('$OUT/prompt_launch.json'))['rows']
except Exception as e:
    print('no'); sys.exit()
bad = [k for k, v in r.items() if v['hidden_max_abs_diff'] > 0.05 * v['hidden_max_abs']]
g = json.load(open('$OUT/prompt_launch.json')).get('decode_graph_check', {})
bad += ['decode graph'] if 'max_abs_diff' in g and g['max_abs_diff'] > 0.05 * g['max_abs'] else []
print('no' if bad or not r else 'yes')")
echo "attentions agree: $OK"
if [ "$OK" = yes ] && [ -n "${MATRIX_ARGS:-}" ]; then
  LEFT=$(( ${T_BUDGET:-575} - ($(date +%s) - T_START) ))
  echo "matrix gets ${LEFT} s"
  T_BUDGET=$LEFT bash scripts/device_matrix.sh
fi
