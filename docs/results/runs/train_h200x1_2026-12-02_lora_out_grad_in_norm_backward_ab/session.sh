set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whla/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 WANDB_MODE=disabled
W=$OUT/w; mkdir -p $W/ab
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv > $W/gpu.csv
M=conf/model/llama3_1b.yaml
pack() { tar czf $OUT/run.tgz -C $OUT w; }
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    if [ $v = old ]; then P=.prev:$PYTHONPATH; else P=$PYTHONPATH; fi
    PYTHONPATH=$P python3 bench/gpu/fms_engine_check.py $M $W/ab/${v}_$r.json "fused=liger lora_rank=16 iters=20" 2>&1 | grep '^{' | cut -c1-160
    pack
  done
  if [ $r = 2 ]; then
    python3 bench/gpu/fms_engine_check.py $M $W/checks_1b.json "fused=liger lora_rank=16 ac=selective iters=3" "fused=liger lora_rank=16 padding_free=true iters=3" 2>&1 | grep '^{' | cut -c1-200; pack
    python3 bench/gpu/fms_engine_check.py conf/model/mistral_7b.yaml $W/checks_7b.json "fused=liger lora_rank=16 iters=3" 2>&1 | grep '^{' | cut -c1-200; pack
  fi
done
