#!/usr/bin/env bash
# One device call (nvidia-h200) closing the twin loop (issue 7): calibrate the executor on the GPU,
# validate the simulator on that profile against the executor at three load levels, tune policies
# in simulation and run the baseline and the winner. DeepSeek-V3 cut to its first 5 layers
# (3 dense + 2 MoE), FP8, dummy weights. Everything lands in $OUT (8 files at most).
# Run from the repo root, with `.whl` carried:  bash scripts/device_twin.sh
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each); the runs use Triton
N=${REQS:-160}

stage "trace: $N chat requests"
python3 - "$OUT/trace_chat.jsonl" "$N" <<'PY'
import sys, numpy as np
from sim.workload import preset, generate
from sim.traces import write_trace
reqs = generate(preset("chat", num_requests=int(sys.argv[2])), np.random.default_rng(0), 64)
write_trace(reqs, sys.argv[1], 64)
print(len(reqs), "requests ->", sys.argv[1])
PY

stage "calibrate, validate, tune: one process, one engine (scripts/device_twin.py)"
timeout ${T_TWIN:-480} python3 scripts/device_twin.py --out "$OUT" --trace "$OUT/trace_chat.jsonl" \
  --model deepseek-v3 --num-layers 5 --dtype fp8 --device cuda --max-input-len ${MAXIN:-1024} --max-output-len ${MAXOUT:-128} --runs ${RUNS:-1} ${TWIN_ARGS:-}

# the same commands one by one (each builds its own engine):
#   twinfer calibrate --model deepseek-v3 --num-layers 5 --dtype fp8 --device cuda --out p.json
#   twinfer validate  --model deepseek-v3 --num-layers 5 --dtype fp8 --device cuda --profile p.json --trace t.jsonl \
#                     --max-input-len 1024 --max-output-len 128 --out v.json --plot v.png      (add --calibrate to measure p.json first)
#   twinfer tune      --model deepseek-v3 --num-layers 5 --dtype fp8 --device cuda --profile p.json --trace t.jsonl --measure
stage "gpu tests: CUDA graphs (capture sizes, graph == eager)"
timeout ${T_TESTS:-90} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_executor_cuda_graphs.py 2>&1 | tail -8
stage done
ls -la "$OUT"
