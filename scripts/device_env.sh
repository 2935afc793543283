# Sourced by the scripts/device_*.sh runs: output to $OUT/log.txt, stage timer, the carried
# wheels (`.whl/`, git-ignored, built by scripts/build_vendor_extract.sh) and the vendor extract on PYTHONPATH.
set -u
OUT=${OUT:-/tmp/twinfer_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
T0=$(date +%s)
stage() { echo; echo "=== $1 (t=$(( $(date +%s) - T0 ))s)"; }

stage install
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || echo "wheel install failed"
fi
if [ -f .whl/vllm_vendor_extract.tar.gz ]; then   # FlashMLA, DeepGEMM, FA3 from vllm==0.26.0: scripts/build_vendor_extract.sh
  mkdir -p /tmp/vendor && tar xzf .whl/vllm_vendor_extract.tar.gz -C /tmp/vendor
fi
export PYTHONPATH="$PWD:/tmp/site:/tmp/vendor"
