#!/usr/bin/env bash
# Issue 18, one device call (nvidia-h200, carry .whl): DeepGEMM's NVRTC JIT on the CUDA 13 image (kernels/jit_cache.py
# puts include/cccl on NVRTC's include path) and the parallel warm-up (kernels/jit_pool.py), then the 5-layer
# DeepSeek-V3 FP8 decode step at B=64 / ctx 4k against the sum of its ops alone, and `twinfer run` at batch 64.
# Stages, in priority order, each under `timeout` and capped by what is left of BUDGET_S (default 330 s):
#   check     one GEMM compiled with NVRTC, then with nvcc, each in a fresh cache   -> jit_check_{nvrtc,nvcc}.json
#   serving   step_deepgemm (engine build = the cold warm-up, pool + NVRTC if the check passed) and step_ops
#             (decode step vs sum of ops alone)                                    -> serving_step.json
#   kernels   `twinfer kernels --device cuda --json` (the recorded choice and JIT compiler) -> kernels.json
#   run64     `twinfer run` 5 layers FP8 batch 64, DeepGEMM (warm cache)              -> run64_deepgemm.json, steps_*.jsonl
#   triton    step_ops with Triton GEMMs/MoE, if time is left                         -> serving_step_triton.json
# Run from the repo root:  bash scripts/device_nvrtc.sh      (results and log.txt in $OUT)
source scripts/device_env.sh
set +e
BUDGET_S=${BUDGET_S:-330}
export TWINFER_CACHE_DIR=/tmp/twinfer_cache_nvrtc
rm -rf "$TWINFER_CACHE_DIR" /tmp/dg_check_nvrtc /tmp/dg_check_nvcc /tmp/twinfer_jit_pool_*   # cold: the warm-up timed is a real compile

# budget CAP: seconds this stage may take (CAP, or what is left of the budget); 0 = skip
budget() { local l=$(( BUDGET_S - ($(date +%s) - T0) )); (( l > $1 )) && l=$1; (( l < 15 )) && l=0; echo $l; }
run() {   # run CAP NAME cmd...: the command under timeout, its exit code logged
  local cap=$1 name=$2; shift 2
  local t; t=$(budget "$cap")
  if (( t == 0 )); then echo "SKIPPED $name: no time left"; echo "{\"$name\": \"skipped: no time left\"}" > "$OUT/skipped_$name.json"; return 99; fi
  echo "(timeout ${t}s)"
  timeout -k 10 "$t" "$@"; local rc=$?
  echo "$name exit code $rc (t=$(( $(date +%s) - T0 ))s)"
  return $rc
}
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@" 2>/dev/null; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  "$CUDA_HOME/bin/nvcc" --version | tail -2; ls "$CUDA_HOME/include/cccl" 2>&1 | head; ls -d "$CUDA_HOME/include/cuda" 2>&1
  echo "cpus $(nproc)"; date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; } | tee "$OUT/env.txt"

stage "check: one DeepGEMM GEMM with NVRTC (include/cccl shim), then nvcc"
DG_JIT_USE_NVRTC=1 DG_JIT_PRINT_COMPILER_COMMAND=1 DG_JIT_CACHE_DIR=/tmp/dg_check_nvrtc \
  run 75 check_nvrtc python3 -m benchmarks.gpu.serving_step "$OUT/jit_check_nvrtc.json" --sections jit_check
DG_JIT_USE_NVRTC=0 DG_JIT_CACHE_DIR=/tmp/dg_check_nvcc \
  run 60 check_nvcc python3 -m benchmarks.gpu.serving_step "$OUT/jit_check_nvcc.json" --sections jit_check
NVRTC_OK=$(jget "$OUT/jit_check_nvrtc.json" "int(bool(d['sections']['jit_check'].get('ok')))")
export DG_JIT_USE_NVRTC=${NVRTC_OK:-0}
echo "NVRTC works: ${NVRTC_OK:-no result} -> DG_JIT_USE_NVRTC=$DG_JIT_USE_NVRTC for the rest"

stage "serving: 5-layer engine cold warm-up (pool of $(nproc) workers), decode step B=64 ctx 4k, sum of ops alone"
run 170 serving python3 -m benchmarks.gpu.serving_step "$OUT/serving_step.json" --sections step_deepgemm,step_ops
{ du -sh "$TWINFER_CACHE_DIR/deepgemm" 2>/dev/null; echo "kernels cached: $(find "$TWINFER_CACHE_DIR/deepgemm/cache" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)"
  ls "$TWINFER_CACHE_DIR/deepgemm/twinfer_warm" 2>&1; } | tee "$OUT/dg_cache.txt"
for f in /tmp/twinfer_jit_pool_*/worker_0.log; do [ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }; done > "$OUT/pool_worker0_logs.txt" 2>&1

stage "twinfer kernels"
run 40 kernels bash -c "python3 -m benchmarks.gpu.cli kernels --device cuda --json > '$OUT/kernels.json'"

stage "twinfer run deepseek-v3 5 layers fp8, batch 64 (deepgemm, warm cache)"
run 95 run64 python3 -m benchmarks.gpu.cli run --model deepseek-v3 --num-layers 5 --device cuda --dtype fp8 \
  --requests 64 --max-input-len 512 --max-output-len 128 --rate 1000 --max-num-seqs 64 --max-model-len 1024 \
  --step-log "$OUT/steps_run64_deepgemm.jsonl" --out "$OUT/run64_deepgemm.json"

stage "serving (if time is left): decode step vs sum of ops alone with Triton GEMMs and MoE"
run 60 triton python3 -m benchmarks.gpu.serving_step "$OUT/serving_step_triton.json" --sections step_ops_triton

stage done
ls -la "$OUT"
