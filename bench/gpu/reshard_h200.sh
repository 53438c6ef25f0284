#!/usr/bin/env bash
# Reshard suites on a 4x H200 machine (NCCL), 1 GiB tensors. Writes sweeps under $1.
#   bash bench/gpu/reshard_h200.sh $OUT
set -u
out=${1:?sweep root}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 WANDB_MODE=offline
sb() { python3 -m sweepbench -m "$@" launch.timeout_s=300 2>&1 | grep -v '^\[' | tail -n 12; }
sb benchmark=reshard benchmark.suite=one_to_m,n_to_m benchmark.strategy=send_recv,broadcast,naive \
   benchmark.m=[1,2,3] benchmark.mesh_ranks=2 benchmark.tensor_bytes=1073741824 hydra.sweep.dir=$out/reshard
sb benchmark=reshard benchmark.suite=one_to_m,n_to_m benchmark.strategy=broadcast benchmark.local_allgather=true \
   benchmark.balance=none,order benchmark.m=[1,2,3] benchmark.mesh_ranks=2 benchmark.tensor_bytes=1073741824 \
   hydra.sweep.dir=$out/reshard_local_allgather
find $out -name wandb -type d -prune -exec rm -rf {} +
