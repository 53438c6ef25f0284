#!/usr/bin/env bash
# The one-H200 checks of this wave (docs/results/h200x1_wave/README.md), in one device call (device kind
# nvidia-h200, carry .whl from ../shared/device/wheels.sh plus the megatron-core 0.19.2 wheel). Results under $OUT.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 NO_FLASH_T1=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
# OLD_TREE: a tree of the code before this wave (git archive f4a437a sweepbench conf hydra_plugins)
export PATH=/tmp/site/bin:$PATH NEW=/tmp/site:$PWD OLD=/tmp/site:${OLD_TREE:-$PWD/.diag/old}
R=$OUT/r; mkdir -p $R/emu_old $R/emu_new
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
# 1. W=2 compute schedule of rank 0 (LocalComm), old code (f4a437a) vs new, same call
for s in 16384 32768; do for code in old new; do P=$([ $code = old ] && echo $OLD || echo $NEW)
  PYTHONPATH=$P timeout 150 python3 bench/gpu/cp_compute_emulated.py $s $R/emu_$code ring,ulysses 2>&1 | grep -E "^(T1|ring|ulysses)" | sed "s/^/$code /" | tee -a $R/emu.txt; done; done
for code in old new; do P=$([ $code = old ] && echo $OLD || echo $NEW)
  PYTHONPATH=$P KVH=8 timeout 100 python3 bench/gpu/cp_compute_emulated.py 16384 $R/emu_$code ring,ulysses 2>&1 | grep -E "^(T1|ring|ulysses)" | sed "s/^/$code /" | tee -a $R/emu.txt; done
export PYTHONPATH=$NEW
# 2. the seed's dilated grid at ring 1 (the crash), every T1 backend probed
timeout 240 python3 -m sweepbench -m experiment=ring_dilated_seed parallelism=cp1 benchmark.seq_len=16384,32768 benchmark.impl=ring,allgather hydra.sweep.dir=$R/dilated_cp1 > $R/dilated_cp1.log 2>&1; echo "dilated rc=$?"; tail -4 $R/dilated_cp1.log
# 3. T1 survives a probe process that is killed / segfaults, on CUDA
timeout 200 python3 -m sweepbench -m benchmark=attention model=llama3_8b parallelism=cp1 benchmark.batch_size=1 benchmark.seq_len=16384 benchmark.t1_fault=kill,segfault benchmark.iters=5 benchmark.warmup=2 hydra.sweep.dir=$R/t1_fault > $R/t1_fault.log 2>&1; echo "t1_fault rc=$?"; tail -3 $R/t1_fault.log
# 4. megatron: in-harness vs standalone twin, tp1->tp1 collocated, 8B, same call
timeout 150 torchrun --nproc-per-node 1 bench/peers/megatron_refit.py --cases "tp1->tp1 collocated" --out $R/megatron_twin.csv 2>&1 | grep -v -i warn | tail -2
timeout 200 python3 -m sweepbench -m experiment=tp2-tp1 parallelism=tp1 benchmark.inference=tp1 benchmark.impl=megatron benchmark.strategy=send_recv benchmark.warmup=2 benchmark.iters=10 hydra.sweep.dir=$R/megatron_co > $R/megatron_co.log 2>&1; echo "megatron rc=$?"; tail -3 $R/megatron_co.log
timeout 150 torchrun --nproc-per-node 1 bench/peers/megatron_refit.py --cases "tp1->tp1 collocated" --out $R/megatron_twin2.csv 2>&1 | grep -v -i warn | tail -2
cd $OUT && find r -name .sweepbench-cache -prune -exec rm -rf {} \; ; find r -name "*.pt.trace.json.gz" -size +20M -delete; tar czf final1.tgz r && rm -rf r && ls -la
