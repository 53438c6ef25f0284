#!/usr/bin/env bash
# The peers against their standalone twins on ONE GPU, interleaved in one device call
# (docs/results/peers_1gpu_h100/README.md): twin, harness, twin, harness, ... so that both sides see
# the same drift of the machine, and the spread between processes shows next to the gap.
#   bash bench/gpu/peers_1gpu.sh        # device kind nvidia-h200; carry .whl (../shared/device/wheels.sh
#                                       # plus the megatron-core 0.19.2 wheel); results in $OUT/peers1.tgz
#   CPU=1 OUT=/tmp/p bash bench/gpu/peers_1gpu.sh   # the same steps at a tiny size on gloo
# megatron-core's refit at tp1->tp1 collocated (llama3_8b, 16.1 GB) and torch's context_parallel at W=1
# (32x128 MHA causal fwd+bwd, 16K and 32K); the W=2 pairs need nvidia-h200-x2.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 WANDB_MODE=offline
if [ -z "${CPU:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
  MEG=(); TW=(--nproc 1); ATT=(model.num_kv_heads=32 benchmark.iters=10 benchmark.warmup=3 benchmark.t1_iters=2); SEQ=(16384 32768)
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
else
  export PYTHONPATH=$PWD
  MEG=(--device cpu --tiny); TW=(--nproc 1 --device cpu --heads 8 --head-dim 8 --dtype float32)
  ATT=(model=tiny backend=gloo benchmark.iters=3 benchmark.warmup=1 benchmark.t1_iters=1); SEQ=(256 512)
fi
R=$OUT/r; mkdir -p $R; ROUNDS=${ROUNDS:-3} FIRST=${FIRST:-1} CP_ROUNDS=${CP_ROUNDS:-2}  # FIRST: number of the first round (a later call goes on counting)
sb() { timeout 240 python3 -m sweepbench -m "$@" 2>&1 | grep -v '^\[' | tail -n 3; }
LEFT=${LEFT:-470}  # seconds after which no new step starts (a device call ends at 600 s; the archive must come back)
for r in $(seq "$FIRST" $((FIRST + ROUNDS - 1))); do
  [ $SECONDS -lt $LEFT ] || break; echo "== round $r"
  timeout 200 torchrun --nproc-per-node 1 bench/peers/megatron_refit.py "${MEG[@]}" --cases "tp1->tp1 collocated" \
      --iters 20 --out $R/megatron_twin_r$r.csv 2>&1 | grep -v -i warn | tail -n 2
  sb experiment=tp2-tp1 parallelism=tp1 benchmark.inference=tp1 benchmark.impl=megatron benchmark.strategy=send_recv \
      benchmark.warmup=2 benchmark.iters=20 $([ -n "${CPU:-}" ] && echo model=tiny backend=gloo) hydra.sweep.dir=$R/megatron_r$r
  if [ "$r" = "$FIRST" ]; then  # A/B: the same harness job with the collector left on while timing, its pauses logged
    echo "== round $r, GC left on while timing (bench/gpu/gc_probe)"
    PYTHONPATH=$PWD/bench/gpu/gc_probe:$PYTHONPATH GC_PROBE=$R/gc_on_r$r GC_PROBE_KEEP_ON=1 \
      sb experiment=tp2-tp1 parallelism=tp1 benchmark.inference=tp1 benchmark.impl=megatron benchmark.strategy=send_recv \
      benchmark.warmup=2 benchmark.iters=20 $([ -n "${CPU:-}" ] && echo model=tiny backend=gloo) hydra.sweep.dir=$R/megatron_gc_on_r$r
  fi
done
for r in $(seq "$CP_ROUNDS"); do
  [ $SECONDS -lt $LEFT ] || break; echo "== torch CP round $r"
  timeout 200 python3 bench/peers/torch_cp.py "${SEQ[@]}" "${TW[@]}" --warmup 3 --iters 10 --out $R/torch_cp_twin_r$r.csv 2>&1 | tail -n 3
  sb experiment=attention_llama3 parallelism=cp1 benchmark.impl=torch_cp \
      benchmark.seq_len=$(IFS=,; echo "${SEQ[*]}") "${ATT[@]}" hydra.sweep.dir=$R/torch_cp_r$r
done
cd $OUT && find r \( -name wandb -o -name .hydra -o -name .sweepbench-cache \) -prune -exec rm -rf {} + ; tar czf peers1.tgz r && rm -rf r && ls -la
