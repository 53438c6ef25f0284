#!/usr/bin/env bash
# The peers against their standalone twins, interleaved in one device call
# (docs/results/peers_1gpu_h100/README.md): twin, harness, twin, harness, ... so that both sides see
# the same drift of the machine, and the spread between processes shows next to the gap.
#   bash bench/gpu/peers_interleaved.sh          # one GPU (kind nvidia-h200); carry .whl (../shared/device/wheels.sh
#                                                # plus the megatron-core 0.19.2 wheel); results in $OUT/peers.tgz
#   GPUS=2 bash bench/gpu/peers_interleaved.sh   # two GPUs (kind nvidia-h200-x2)
#   CPU=1 OUT=/tmp/p bash bench/gpu/peers_interleaved.sh   # the same steps at a tiny size on gloo (the
#                                                          # harness side of torch CP as impl=ring: no CPU kernel)
# GPUS=1: megatron-core's refit tp1->tp1 collocated and torch's context_parallel at W=1.
# GPUS=2: tp2->tp1 collocated and tp1->tp1 non-collocated, torch CP at W=2 (issue 17 item 3).
# Both at llama3_8b (16.1 GB of bf16 weights) and 32x128 MHA causal fwd+bwd, 16K and 32K.
# ROUNDS (3) megatron rounds numbered from FIRST (1), the first with an A/B whose harness job keeps
# Python's collector on while timing (bench/gpu/gc_probe); CP_ROUNDS (2) torch CP rounds.
# Summary: python bench/gpu/peers_summary.py r --out peers.csv (r: the archive's folder).
set -u
. bench/gpu/device_env.sh
GPUS=${GPUS:-1}
if [ -z "${CPU:-}" ]; then
  MEG=(); SB=(); TW=(); ATT=(model.num_kv_heads=32 benchmark.iters=10 benchmark.warmup=3 benchmark.t1_iters=2); SEQ=(16384 32768); CPI=torch_cp
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
else
  MEG=(--device cpu --tiny); SB=(model=tiny backend=gloo); TW=(--device cpu --heads 8 --head-dim 8 --dtype float32)
  ATT=(model=tiny model.num_kv_heads=8 backend=gloo benchmark.iters=3 benchmark.warmup=1 benchmark.t1_iters=1); SEQ=(256 512); CPI=ring  # torch_cp runs on CUDA only
fi
if [ "$GPUS" = 1 ]; then
  CASES=("tp1->tp1 collocated"); HARNESS=("parallelism=tp1 mode=collocated")
else
  CASES=("tp2->tp1 collocated" "tp1->tp1 non-collocated"); HARNESS=("parallelism=tp2 mode=collocated" "parallelism=tp1 mode=non_collocated")
fi
R=$OUT/r; mkdir -p $R; ROUNDS=${ROUNDS:-3} FIRST=${FIRST:-1} CP_ROUNDS=${CP_ROUNDS:-2}
sb() { timeout 240 python3 -m sweepbench -m "$@" 2>&1 | grep -v '^\[' | tail -n 2; }
refit() { sb experiment=tp2-tp1 benchmark.inference=tp1 benchmark.impl=megatron benchmark.strategy=send_recv \
            benchmark.warmup=2 benchmark.iters=20 "${SB[@]}" "$@"; }
LEFT=${LEFT:-470}  # seconds after which no new step starts (a device call ends at 600 s; the archive must come back)
for r in $(seq "$FIRST" $((FIRST + ROUNDS - 1))); do
  for i in "${!CASES[@]}"; do
    [ $SECONDS -lt $LEFT ] || break 2; echo "== round $r: ${CASES[$i]}"; c=$i; [ "$GPUS" = 1 ] && c=""  # W=1 keeps the old names
    timeout 200 torchrun --nproc-per-node "$GPUS" bench/peers/megatron_refit.py "${MEG[@]}" --cases "${CASES[$i]}" \
        --iters 20 --out $R/megatron${c}_twin_r$r.csv 2>&1 | grep -v -i warn | tail -n 1
    refit ${HARNESS[$i]} hydra.sweep.dir=$R/megatron${c}_r$r
    if [ "$r" = "$FIRST" ]; then  # A/B: the same harness job with the collector left on while timing, its pauses logged
      echo "== round $r: ${CASES[$i]}, GC left on while timing (bench/gpu/gc_probe)"
      PYTHONPATH=$PWD/bench/gpu/gc_probe:$PYTHONPATH GC_PROBE=$R/gc_on${c}_r$r GC_PROBE_KEEP_ON=1 \
        refit ${HARNESS[$i]} hydra.sweep.dir=$R/megatron${c}_gc_on_r$r
    fi
  done
done
for r in $(seq "$CP_ROUNDS"); do
  [ $SECONDS -lt $LEFT ] || break; echo "== torch CP W=$GPUS round $r"
  timeout 200 python3 bench/peers/torch_cp.py "${SEQ[@]}" --nproc "$GPUS" "${TW[@]}" --warmup 3 --iters 10 \
      --out $R/torch_cp_twin_r$r.csv 2>&1 | tail -n 3
  sb experiment=attention_llama3 parallelism=cp$GPUS benchmark.impl=$CPI \
      benchmark.seq_len=$(IFS=,; echo "${SEQ[*]}") "${ATT[@]}" hydra.sweep.dir=$R/torch_cp_r$r
done
cd $OUT && find r \( -name wandb -o -name .hydra -o -name .sweepbench-cache \) -prune -exec rm -rf {} + ; tar czf peers.tgz r && rm -rf r && ls -la
