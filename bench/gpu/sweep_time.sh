#!/usr/bin/env bash
# A sweep's wall time before and after a change of code, on one machine: the default attention
# sweep at W=1 (8 jobs: MHA and GQA-8, 16K-128K) and the 1B fine-tune sweep (4 jobs: LoRA 0/16 x
# compile off/on), each run from the tree named by its step, timed from the command's start to its
# exit. A tree is a folder holding sweepbench/, conf/ and hydra_plugins/, e.g.
# `git archive REV sweepbench conf hydra_plugins | tar -x -C DIR`.
#
#   bash bench/gpu/sweep_time.sh BEFORE_TREE AFTER_TREE OUT STEP...
#   CPU=1 bash bench/gpu/sweep_time.sh ... STEP...     # the same steps at tiny size on gloo
#
# Steps:
#   attn_before      the attention sweep from BEFORE_TREE
#   attn_cold        from AFTER_TREE with an empty store of baselines (OUT/store, removed first), fresh ranks
#   attn_warm        from AFTER_TREE again with the store attn_cold left, fresh ranks
#   attn_warm_kept   attn_warm with launch.keep_ranks=true
#   attn_cold_kept   attn_cold with launch.keep_ranks=true (its own empty store, OUT/store_kept)
#   train_before     the train sweep from BEFORE_TREE
#   train_after      from AFTER_TREE (OUT/store, as the attention steps), fresh ranks
#   train_kept       train_after with launch.keep_ranks=true
#   attn_default_cold, attn_default_warm, train_default, train_default_again
#                    from AFTER_TREE with launch.keep_ranks left at its default (own store OUT/store_default,
#                    emptied by attn_default_cold; train_default_again: train_default once more, with the
#                    Inductor cache the first left); EXTRA="k=v ..." adds overrides to these four
#   attn_default_warm_before  attn_default_warm from BEFORE_TREE, on the store attn_default_cold left
#   attn_default_warm_again   attn_default_warm once more (its own sweep folder)
# Fresh ranks: launch.keep_ranks=false (ranks of attention and train jobs on GPUs are kept by default).
# The train steps share one Inductor cache (OUT/inductor, made by the first of them that runs).
# Writes OUT/<step>/ (the sweep), OUT/<step>.log and one line per step to OUT/steps.txt:
# `<step> rc=<exit code> wall_s=<seconds>`, and the sweep's own `measuring fraction` line.
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: sweep_time.sh BEFORE_TREE AFTER_TREE OUT STEP..." >&2; exit 2; }
before=$(cd "$1" && pwd) after=$(cd "$2" && pwd) out=$3; shift 3
mkdir -p "$out"; out=$(cd "$out" && pwd)
py=${PYTHON:-python}
export TORCHINDUCTOR_CACHE_DIR=$out/inductor WANDB_MODE=${WANDB_MODE:-disabled}

attn=(experiment=attention_llama3 parallelism=cp1 benchmark.impl=ring)
train=(benchmark=train model=llama3_1b parallelism=tp1 benchmark.seq_len=4096 benchmark.micro_batch=4
       benchmark.lora_rank=0,16 benchmark.compile=false,true)
if [ "${CPU:-0}" = 1 ]; then
  attn+=(backend=gloo "benchmark.seq_len=256,512" benchmark.dtype=float32 benchmark.iters=2 benchmark.warmup=1
         benchmark.t1_iters=1)
  train=(benchmark=train model=tiny backend=gloo parallelism=tp1 benchmark.seq_len=64 benchmark.micro_batch=2
         benchmark.lora_rank=0,8 benchmark.compile=false benchmark.iters=3 benchmark.warmup=1)
fi

in_tree() {  # TREE STEP ARGS...: `python -m sweepbench -m ARGS` with TREE's code, timed
  local tree=$1 step=$2; shift 2
  local t0 t1 rc
  t0=$(date +%s.%N)
  (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" "$py" -m sweepbench -m "$@" \
     hydra.sweep.dir="$out/$step") >"$out/$step.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  awk -v s="$step" -v r="$rc" -v a="$t0" -v b="$t1" 'BEGIN { printf "%s rc=%s wall_s=%.2f\n", s, r, b - a }' | tee -a "$out/steps.txt"
  grep -h "measuring fraction" "$out/$step.log" | sed "s/^/  /" | tee -a "$out/steps.txt"
}

for step in "$@"; do
  case $step in
    attn_before) in_tree "$before" "$step" "${attn[@]}" ;;
    attn_cold) rm -rf "$out/store"; in_tree "$after" "$step" "${attn[@]}" store.dir="$out/store" launch.keep_ranks=false ;;
    attn_warm) in_tree "$after" "$step" "${attn[@]}" store.dir="$out/store" launch.keep_ranks=false ;;
    attn_warm_kept) in_tree "$after" "$step" "${attn[@]}" store.dir="$out/store" launch.keep_ranks=true ;;
    attn_cold_kept) rm -rf "$out/store_kept"
      in_tree "$after" "$step" "${attn[@]}" store.dir="$out/store_kept" launch.keep_ranks=true ;;
    train_before) in_tree "$before" "$step" "${train[@]}" ;;
    train_after) in_tree "$after" "$step" "${train[@]}" store.dir="$out/store" launch.keep_ranks=false ;;
    train_kept) in_tree "$after" "$step" "${train[@]}" store.dir="$out/store" launch.keep_ranks=true ;;
    attn_default_cold) rm -rf "$out/store_default"
      in_tree "$after" "$step" "${attn[@]}" store.dir="$out/store_default" ${EXTRA:-} ;;
    attn_default_warm|attn_default_warm_again) in_tree "$after" "$step" "${attn[@]}" store.dir="$out/store_default" ${EXTRA:-} ;;
    attn_default_warm_before) in_tree "$before" "$step" "${attn[@]}" store.dir="$out/store_default" ${EXTRA:-} ;;
    train_default|train_default_again) in_tree "$after" "$step" "${train[@]}" store.dir="$out/store_default" ${EXTRA:-} ;;
    *) echo "unknown step: $step (valid: attn_before attn_cold attn_warm attn_warm_kept attn_cold_kept" \
            "train_before train_after train_kept attn_default_cold attn_default_warm attn_default_warm_before" \
            "attn_default_warm_again train_default train_default_again)" >&2; exit 2 ;;
  esac
done
