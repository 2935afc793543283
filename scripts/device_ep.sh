#!/usr/bin/env bash
# One device call on a host of several GPUs (nvidia-h200-x2 or larger) for expert parallelism
# (issue 10): NCCL correctness (the gpu-marked EP tests; widths above the GPU count skip), then
# the EP benchmark by width on the tiny model and on a DeepSeek-V3-width stack (4 layers, FP8).
# Run from the repo root with `.whl` carried:  bash scripts/device_ep.sh
# EP widths default to 1..(number of GPUs); results and profiles land in $OUT.
source scripts/device_env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast here
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
nvidia-smi topo -m || true
NG=$(python3 -c "import torch; print(torch.cuda.device_count())")
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'triton', triton.__version__)"
EPS=${EPS:-$(python3 -c "print(','.join(str(n) for n in (1, 2, 4, 8) if n <= $NG))")}
echo "GPUs: $NG  EP widths: $EPS"

stage "NCCL correctness: gpu-marked EP tests"
timeout ${T_TESTS:-240} python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/test_ep_moe.py tests/test_ep_model.py 2>&1 | grep -v "^E  *+"

stage "ep_bench: tiny model, bf16"
timeout ${T_TINY:-150} python3 benchmarks/ep_bench.py --backend nccl --ep "$EPS" --dtype bf16 --tokens 16,128,1024 \
  --iters ${ITERS:-30} --out "$OUT/ep_profile.json"

stage "ep_bench: DeepSeek-V3 width, 4 layers (3 dense + 1 MoE), fp8"
timeout ${T_DSV3:-200} python3 benchmarks/ep_bench.py --backend nccl --ep "$EPS" --model deepseek-v3 --num-layers 4 --dtype fp8 \
  --tokens 16,128,1024 --iters ${ITERS:-30} --out "$OUT/ep_profile_dsv3.json"
stage done
ls -la "$OUT"
