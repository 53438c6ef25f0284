set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whla/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 WANDB_MODE=disabled
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv > $OUT/gpu.csv
python3 bench/gpu/fms_engine_check.py conf/model/llama3_1b.yaml $OUT/checks_1b.json "fused=liger lora_rank=16 iters=3" "fused=liger lora_rank=16 ac=full iters=3" "fused=liger lora_rank=16 ac=selective iters=3" "fused=liger lora_rank=16 padding_free=true iters=3" "fused=liger lora_rank=0 iters=3" 2>&1 | grep '^{' | cut -c1-260
python3 bench/gpu/fms_engine_check.py conf/model/mistral_7b.yaml $OUT/checks_7b.json "fused=liger lora_rank=16 iters=3" 2>&1 | grep '^{' | cut -c1-260
python3 .gpurun/wide_engaged.py conf/model/llama3_1b.yaml 2>&1 | tail -3
