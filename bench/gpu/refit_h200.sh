#!/usr/bin/env bash
# Refit presets on a 4x H200 machine (NCCL; nvshmem where it runs). Writes sweeps under $1.
#   bash bench/gpu/refit_h200.sh $OUT
set -u
out=${1:?sweep root}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 WANDB_MODE=offline
sb() { python3 -m sweepbench -m "$@" launch.timeout_s=300 2>&1 | grep -v '^\[' | tail -n 40; }
# 2 GPUs: tp2 -> tp1 collocated at 8B, strategies side by side, then nvshmem
sb experiment=tp2-tp1 benchmark.strategy=send_recv,broadcast,naive hydra.sweep.dir=$out/refit_tp2-tp1
# bucket size: bigger NCCL messages vs pack/unpack copies
sb experiment=tp2-tp1 benchmark.bucket_bytes=268435456,1073741824,2147483648 hydra.sweep.dir=$out/refit_tp2-tp1_buckets
sb experiment=tp2-tp1 backend=nvshmem hydra.sweep.dir=$out/refit_tp2-tp1_nvshmem
# 4 GPUs
sb experiment=tp2-tp4,tp2pp2-tp4pp1 benchmark.strategy=send_recv,broadcast hydra.sweep.dir=$out/refit_4gpu
sb experiment=ep2-ep4 benchmark.strategy=send_recv,broadcast hydra.sweep.dir=$out/refit_ep2-ep4
# non-collocated: tp2 training on GPUs 0-1, tp2 inference on GPUs 2-3
sb experiment=tp2-tp1 benchmark.inference=tp2 mode=non_collocated benchmark.strategy=send_recv,broadcast,naive hydra.sweep.dir=$out/refit_noncoloc
find $out -name wandb -type d -prune -exec rm -rf {} +
find $out -name .hydra -type d -prune -exec rm -rf {} +
