#!/usr/bin/env bash
# impl=torch_graph on one GPU (issue 18): does a sample captured as a CUDA graph run, verified, on
# NCCL, and how much of the eager per-call time is the host's? One sweep, impl=torch,torch_graph,
# 1 MiB - 1 GiB, at world size 1 (NCCL's collectives of one rank are device-local copies: what is
# left of a call's time in eager mode is mostly the host issuing it). Device kind nvidia-h200 (or
# nvidia-h100-x1); carry .whl (../shared/device/wheels.sh). Results under $OUT/graph_1gpu.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
R=$OUT/graph_1gpu; mkdir -p $R
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"; } | tee $R/gpu.txt
timeout 240 python3 -m sweepbench -m benchmark=collective parallelism=tp1 "benchmark.impl=torch,torch_graph" \
  "benchmark.ops=[all_reduce,all_gather,reduce_scatter,broadcast,all_to_all]" benchmark.min_bytes=1048576 \
  benchmark.max_bytes=1073741824 benchmark.step_factor=4 benchmark.dtype=float32 benchmark.warmup=5 benchmark.iters=20 \
  benchmark.ops_per_sample=20 hydra.sweep.dir=/tmp/graph_1gpu > $R/sweep.log 2>&1; echo "sweep rc=$?"
cp /tmp/graph_1gpu/results.csv $R/ 2>/dev/null
for d in /tmp/graph_1gpu/collective-*/; do cp $d/metrics.json $R/$(basename $d).metrics.json; done
tail -5 $R/sweep.log; ls $R
