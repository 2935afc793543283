# Sourced by the scripts/device_*.sh runs: output to $OUT/log.txt, stage timer, the carried
# wheels (`.whl/`, git-ignored, built by scripts/build_vendor_extract.sh) and the vendor extract on PYTHONPATH.
set -u
OUT=${OUT:-/tmp/twinfer_out}
mkdir -p "$OUT"
if [ -z "${TWINFER_DEVICE_ENV:-}" ]; then   # once per call: a script run by another (device_prompt_launch.sh) reuses it
  exec > >(tee -a "$OUT/log.txt") 2>&1
fi
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
T0=$(date +%s)
stage() { echo; echo "=== $1 (t=$(( $(date +%s) - T0 ))s)"; }

stage install
if [ -n "${TWINFER_DEVICE_ENV:-}" ]; then echo "(installed earlier in this call)"
elif ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || echo "wheel install failed"
fi
for x in .whl/vllm_vendor_extract.tar.xz .whl/vllm_vendor_extract.tar.gz; do   # FlashMLA, DeepGEMM, FA3 from vllm==0.26.0
  if [ -f "$x" ] && [ -z "${TWINFER_DEVICE_ENV:-}" ]; then                                                          # (scripts/build_vendor_extract.sh)
    mkdir -p /tmp/vendor && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('/tmp/vendor', filter='data')" "$x" \
      || echo "vendor extract $x: unpack failed"
    break
  fi
done
export PYTHONPATH="$PWD:/tmp/site:/tmp/vendor" TWINFER_DEVICE_ENV=1

# env.txt for a Triton-GEMM probe: the GPU, driver, torch/CUDA/triton, the date, and the dense FP8 GEMM library
# (default triton: the matrix runs' engine; DeepGEMM JIT-compiles ~160 s on an empty cache)
env_txt_triton() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
    nvidia-smi --query-gpu=uuid,serial,vbios_version,power.limit,power.default_limit,clocks.max.sm --format=csv 2>&1
    python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
    date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
  export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}
  echo "TWINFER_KERNEL_FP8_GEMM=$TWINFER_KERNEL_FP8_GEMM" | tee -a "$OUT/env.txt"
}
