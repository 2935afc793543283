#!/usr/bin/env bash
# One device call (nvidia-h200): the op tables of device time (benchmarks/gpu/op_tables.py) with the
# vendor kernels of .whl/ (KERNELS.md). Output in $OUT: op_tables.csv, op_tables.provenance.json, log.txt.
#   run from the repo root with .whl carried:  bash scripts/device_op_tables.sh
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
stage "op tables"
timeout ${T_TABLES:-540} python3 -m benchmarks.gpu.op_tables --out-dir "$OUT" ${TABLE_ARGS:-}
stage done
