#!/usr/bin/env bash
# One device call: a decode graph's pipelined launch against its held forward and the sampler (issue 16,
# benchmarks/gpu/launch_span_probe.py), on the matrix's engine. Run from the repo root with `.whl` carried.
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,uuid,power.limit --format=csv | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}
export TWINFER_PIECEWISE_GRAPHS=${TWINFER_PIECEWISE_GRAPHS:-1}
stage "launch span probe"
timeout "${T_PROBE:-170}" python3 benchmarks/gpu/launch_span_probe.py || echo "probe rc $?"
stage done
