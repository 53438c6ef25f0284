#!/usr/bin/env bash
# GQA K/V handed to cuDNN as they are (issue 20): rank 0's W=2 compute schedule (bench/gpu/cp_compute_emulated.py)
# for ring and Ulysses at GQA-8 and MHA, the code before (OLD_TREE: git archive of the commit before, default
# .diag/old) and after, in one call; then a verified cp1 sweep of the GQA model on the new code.
# Device kind nvidia-h200; carry .whl (../shared/device/wheels.sh) and .diag. Results as $OUT/gqa_native.tgz.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PATH=/tmp/site/bin:$PATH NEW=/tmp/site:$PWD OLD=/tmp/site:${OLD_TREE:-$PWD/.diag/old}
R=$OUT/gqa_native; mkdir -p $R/emu_old $R/emu_new
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
for kvh_s in 8:16384 8:32768 32:16384; do kvh=${kvh_s%%:*} s=${kvh_s##*:}; for code in old new; do P=$([ $code = old ] && echo $OLD || echo $NEW)
  PYTHONPATH=$P KVH=$kvh timeout 150 python3 bench/gpu/cp_compute_emulated.py $s $R/emu_$code ring,ulysses 2>&1 | grep -E "^(T1|ring|ulysses)" | sed "s/^/$code kvh=$kvh /" | tee -a $R/emu.txt; done; done
export PYTHONPATH=$NEW
timeout 240 python3 -m sweepbench -m experiment=attention_llama3 parallelism=cp1 benchmark.seq_len=16384 benchmark.impl=ring,ulysses,allgather benchmark.iters=10 benchmark.warmup=3 hydra.sweep.dir=$R/cp1_gqa > $R/cp1_gqa.log 2>&1; echo "cp1_gqa rc=$?"; tail -8 $R/cp1_gqa.log
cd $OUT && find gqa_native \( -name .sweepbench-cache -o -name "*.parquet" -o -name wandb \) -prune -exec rm -rf {} \; ; find gqa_native -name "*.pt.trace.json.gz" -size +10M -delete; tar czf gqa_native.tgz gqa_native && rm -rf gqa_native && ls -la
