#!/usr/bin/env bash
# Builds the git-ignored `.whl/` that the device runs carry (scripts/device_env.sh installs it there), on a CPU machine
# with the package index KERNELS.md describes:
#   - wheels the device image lacks: pydantic (+ its pinned pydantic_core), annotated_types, typing_inspection,
#     typing_extensions, simpy (cp312, manylinux x86_64);
#   - .whl/vllm_vendor_extract.tar.xz: from vllm==0.26.0's wheel, FlashMLA (vllm/_flashmla_*C.abi3.so and
#     vllm/third_party/flashmla), DeepGEMM (vllm/third_party/deep_gemm, without its per-Python _C builds other than
#     cp312's), and FlashAttention-3 (vllm/vllm_flash_attn: its interface and _vllm_fa3_C.abi3.so, sm90; the FA2
#     extension, 300 MB, and the FA4 CuTe sources are left out), with empty vllm/__init__.py files so nothing of vLLM
#     itself is imported; xz -9e, not gzip: 10.3 MB where gzip made 42.4 and xz -6 13.5 (the device's carry limit, 64 MiB, counts the
#     tracked tree too: 21.8 MB on 2026-12-02). About 16 MiB in all. FlashMLA and DeepGEMM are MIT,
#     vLLM's FlashAttention build Apache-2.0: carried, never committed.
# Usage (repo root): bash scripts/build_vendor_extract.sh     (~1 minute on 2 cores; rebuilds from scratch)
set -euo pipefail
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64"
PIP="python3 -m pip download -q --no-deps $PLAT"
rm -rf .whl && mkdir -p .whl
$PIP -d .whl pydantic pydantic_core annotated_types typing_inspection typing_extensions simpy 2>/dev/null
python3 - <<'PY'   # pydantic pins one pydantic_core: fail here, not on the device
import glob, re, zipfile
pyd = glob.glob(".whl/pydantic-2*.whl")[0]
meta = zipfile.ZipFile(pyd).read(next(n for n in zipfile.ZipFile(pyd).namelist() if n.endswith("METADATA"))).decode()
want = re.search(r"Requires-Dist: pydantic-core==([\d.]+)", meta).group(1)
have = re.search(r"pydantic_core-([\d.]+)-", glob.glob(".whl/pydantic_core-*.whl")[0]).group(1)
assert want == have, f"pydantic needs pydantic_core {want}, downloaded {have}: pip download pydantic_core=={want}"
print(f"pydantic_core {have} matches")
PY
TMP=$(mktemp -d)
$PIP -d "$TMP/whl" vllm==0.26.0 2>/dev/null
( cd "$TMP" && unzip -q whl/vllm-0.26.0-*.whl 'vllm/_flashmla_C.abi3.so' 'vllm/_flashmla_extension_C.abi3.so' \
    'vllm/third_party/flashmla/*' 'vllm/third_party/deep_gemm/*' 'vllm/vllm_flash_attn/__init__.py' \
    'vllm/vllm_flash_attn/flash_attn_interface.py' 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' \
  && rm -f vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so \
  && touch vllm/__init__.py vllm/third_party/__init__.py \
  && tar cf - vllm | xz -T0 -9e > vllm_vendor_extract.tar.xz )
mv "$TMP/vllm_vendor_extract.tar.xz" .whl/ && rm -rf "$TMP"
du -sh .whl; ls -la .whl
