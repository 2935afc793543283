#!/usr/bin/env bash
# One device call (nvidia-h200), issue 16: a prompt chunk's forward issue on the host with its KV pages contiguous
# (as the calibration grid lays them) and scattered over the cache (as serving's are), with and without a cached
# prefix (benchmarks/gpu/prefix_issue_probe.py). Output: $OUT/prefix_issue.json, $OUT/env.txt, $OUT/log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_prefix_issue.sh     (about 2 minutes with the install)
source scripts/device_env.sh
env_txt_triton
stage "prompt chunk issue, pages contiguous vs scattered (benchmarks/gpu/prefix_issue_probe.py)"
timeout ${T_BENCH:-150} python3 -m benchmarks.gpu.prefix_issue_probe --out "$OUT/prefix_issue.json" --repeats ${REPEATS:-15} \
  || echo "prefix issue probe: exit $? (finished shapes are in the json)"
stage done
