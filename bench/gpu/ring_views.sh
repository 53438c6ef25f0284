#!/usr/bin/env bash
# Issue 20 on one GPU (kind nvidia-h100-x1 or nvidia-h200; no wheels needed): the ring's W=2 compute per rank
# (LocalComm emulation) before (OLD_TREE) and after the row views and dK/dV spans, and with the LSE merge compiled
# into one pass (FUSED_MERGE=1, 16K only), interleaved in the same call; and the W-rank ring verified on the GPU's
# kernels as threads (bench/gpu/ring_threads.py). Results under $OUT/r (docs/results/ring_views_h100).
# OLD_TREE: the code before (git archive 14ce92d sweepbench | tar -x -C .diag/old; carry .diag/old). A second use
# (docs/results/merge_kernel_h100): OLD_TREE at 29eb560, new = the Triton merge.
export PYTHONUNBUFFERED=1 NO_FLASH_T1=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NEW=$PWD OLD=${OLD_TREE:-$PWD/.diag/old} ROUNDS=${ROUNDS:-3} LENS=${LENS:-16384 32768}
codes() { if [ $1 = 16384 ]; then echo old new fused; else echo old new; fi; }
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
# 1. the ring verified as W threads on this GPU (cuDNN views, spans, merges), with the harness's tolerance
for env in "W=2" "W=2 KVH=8" "W=2 BACKEND=flash" "W=2 CAUSAL=0" "W=4"; do
  env $env PYTHONPATH=$NEW timeout 120 python3 bench/gpu/ring_threads.py 16384 $([ "$env" = W=2 ] && echo 32768) 2>&1 | tail -3 | sed "s/^/$env: /" | tee -a $R/threads.txt
done
# 2. compute per emulated rank, interleaved; one profiled step per (code, rank) at 16K in round 1
for round in $(seq $ROUNDS); do for L in $LENS; do for code in $(codes $L); do for r in 0 1; do
  mkdir -p $R/tr_${code}_r$r
  PYTHONPATH=$([ $code = old ] && echo $OLD || echo $NEW) FUSED_MERGE=$([ $code = fused ] && echo 1) RANK_EMU=$r \
    NO_TRACE=$([ $round = 1 ] && [ $L = 16384 ] || echo 1) timeout 100 python3 bench/gpu/cp_compute_emulated.py $L $R/tr_${code}_r$r ring$([ $code = new ] && echo ,ulysses) 2>&1 \
    | grep -E "^(T1|ring|ulysses|Traceback|.*Error)" | sed "s/^/round$round $code /" | tee -a $R/emulated.txt
done; done; done; done
for code in old new; do for r in 0 1; do
  PYTHONPATH=$([ $code = old ] && echo $OLD || echo $NEW) KVH=8 RANK_EMU=$r NO_TRACE=1 timeout 100 python3 bench/gpu/cp_compute_emulated.py 16384 /tmp ring$([ $code = new ] && echo ,ulysses) 2>&1 \
    | grep -E "^(T1|ring|ulysses|Traceback|.*Error)" | sed "s/^/gqa $code /" | tee -a $R/emulated.txt
done; done
# 3. with .whl carried (../shared/device/wheels.sh): the seed's dilated grid at ring 1 through the harness, whose
# branch merges go through accum.merge_ on the GPU, verified against T1's reference before any time counts
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$NEW timeout 240 python3 -m sweepbench -m experiment=ring_dilated_seed \
    parallelism=cp1 benchmark.seq_len=16384 benchmark.impl=ring,allgather hydra.sweep.dir=$R/dilated_cp1 > $R/dilated_cp1.log 2>&1
  echo "dilated cp1 rc=$?" | tee -a $R/threads.txt; tail -4 $R/dilated_cp1.log
fi
for f in $R/tr_*/ring_16384_kv32.pt.trace.json.gz; do echo "== $f"; python3 bench/gpu/trace_top.py $f --top 12; done > $R/trace_top_16k.txt 2>&1
rm -f $R/tr_*/*.pt.trace.json.gz; find $R -type f -size +5M -delete
cd $OUT && tar czf ring_views.tgz r && rm -rf r && ls -la
