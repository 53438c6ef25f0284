#!/usr/bin/env bash
# The 2-GPU checks of this wave in ONE device call on nvidia-h200-x2 (device time is short: most
# important first, each step with its own time limit, results appended to $OUT/x2.tar as each step
# ends so that a cut-off call still brings back what finished). Carry .whl (../shared/device/wheels.sh)
# and .peers (the nccl-tests source: git archive of NVIDIA/nccl-tests into .peers/nccl-tests).
#   1. attention W=2: ring, ulysses, torch_cp x MHA/GQA-8 x 16K/32K, verified (issues 20, 17)
#   2. torch_cp's standalone twin, MHA 16K/32K (issue 17 item 3)
#   3. collective tp2: impl=torch,nccl_tests in one sweep, 1 MiB - 1 GiB (issue 18 section 1)
#   4. the seed's dilated grid at ring 2, 16K (issue 17 item 1)
#   5. compare on GPU rounds: collective base / twin / slow 1.3x, sweep.repeats=3 (issue 18 section 2)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
R=$OUT/x2; mkdir -p $R
keep() { find x2 \( -name .sweepbench-cache -o -name "*.parquet" -o -name wandb -o -name "*.pt" \) -prune -exec rm -rf {} + 2>/dev/null
         tar rf $OUT/x2.tar x2 2>/dev/null; rm -rf x2/*; }
sb() { local name=$1 t=$2; shift 2; timeout $t python3 -m sweepbench -m "$@" hydra.sweep.dir=$R/$name > $R/$name.log 2>&1
       echo "$name rc=$? $(grep -c ',ok,' $R/$name/results.csv 2>/dev/null) ok"; tail -25 $R/$name.log | grep -vE "Warning|warn" > $R/$name.tail; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"; } | tee $R/gpu.txt
S=$SECONDS
sb attn_cp2 200 experiment=attention_llama3 parallelism=cp2 "benchmark.impl=ring,ulysses,torch_cp" \
   "model.num_kv_heads=32,8" "benchmark.seq_len=16384,32768" benchmark.iters=5 benchmark.warmup=2 benchmark.t1_iters=2
echo "attn $((SECONDS-S)) s"; (cd $OUT && keep)
timeout 80 python3 bench/peers/torch_cp.py 16384 32768 --backend cudnn --warmup 2 --iters 5 --out $R/torch_cp_twin.csv > $R/torch_cp_twin.log 2>&1; echo "twin rc=$?"; tail -4 $R/torch_cp_twin.log
echo "twin $((SECONDS-S)) s"; (cd $OUT && keep)
PYTHON=python3 JOBS=32 timeout 150 bash bench/peers/build_nccl_tests.sh .peers/nccl-tests /tmp/nt > $R/nccl_tests_build.log 2>&1; echo "build rc=$?"; tail -3 $R/nccl_tests_build.log
echo "build $((SECONDS-S)) s"
sb coll_vs_nccl_tests 120 benchmark=collective parallelism=tp2 "benchmark.ops=[all_reduce,all_gather,reduce_scatter,send_recv]" \
   benchmark.min_bytes=1048576 benchmark.max_bytes=1073741824 benchmark.step_factor=4 benchmark.dtype=float32 \
   benchmark.warmup=5 benchmark.iters=20 benchmark.ops_per_sample=20 "benchmark.impl=torch,torch_graph,nccl_tests" benchmark.nccl_tests_dir=/tmp/nt
echo "coll $((SECONDS-S)) s"; (cd $OUT && keep)
sb dilated_cp2 90 experiment=ring_dilated_seed parallelism=cp2 benchmark.seq_len=16384
echo "dilated $((SECONDS-S)) s"; (cd $OUT && keep)
C="benchmark=collective parallelism=tp2 benchmark.ops=[all_reduce,all_gather] benchmark.min_bytes=1048576 benchmark.max_bytes=268435456 benchmark.step_factor=16 benchmark.iters=20 benchmark.warmup=5 sweep.repeats=3"
sb cmp_base 60 $C; sb cmp_twin 60 $C; sb cmp_slow 60 $C fault.kind=slow fault.factor=1.3
for c in twin slow; do python3 -m sweepbench compare $R/cmp_base $R/cmp_$c -o $R/compare_$c > $R/compare_$c.txt 2>&1; tail -3 $R/compare_$c.txt; done
echo "compare $((SECONDS-S)) s"; (cd $OUT && keep && gzip -f x2.tar && ls -la)
