#!/usr/bin/env bash
# One device call (nvidia-h200) for the figures issue 23 and issue 22 ask for, each stage with its own timeout so
# one hang cannot eat the call: async overlap off vs on at three loads (scripts/device_async.sh), sliding-window
# resume policies measured vs predicted (scripts/device_replay.sh), then the gpu-marked HF parity tests.
# Run from the repo root with `.whl` carried:  bash scripts/device_final.sh
T_ASYNC=${T_ASYNC:-250} bash scripts/device_async.sh
T_REPLAY=${T_REPLAY:-190} bash scripts/device_replay.sh
source scripts/device_env.sh
stage "gpu parity tests (issue 22)"
timeout ${T_TESTS:-110} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_hf_parity.py 2>&1 | tee "$OUT/pytest_hf_parity.txt" | tail -15
stage done
