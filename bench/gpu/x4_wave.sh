#!/usr/bin/env bash
# On a 4-GPU machine (nvidia-h100-x4 / nvidia-h200-x4): x2_wave2.sh's 2-GPU steps in two streams side
# by side, stream A on GPUs 0,1 and stream B on GPUs 2,3 (their sweeps rendezvous on free ports; the
# torchrun twins run --standalone), after the steps that need all four GPUs (ALL4, first: the streams'
# LEFT guard then cuts what a call has no time for). A device call thus does
# twice the 2-GPU work of x2_wave2.sh alone, at the price of a neighbour on the host (each pair has
# its own NVLinks; the CPUs and host memory are shared): a figure to compare against one measured
# alone says so. Everything comes back as one archive, $OUT/x4.tar.gz (a/, b/, all4/: each holds
# x2_wave2.sh's w.tar.gz and steps.txt, and the stream's log).
#   ALL4="usp4" A="attn12" B="megatron_nc refit_left" AB_LEFT=400 bash bench/gpu/x4_wave.sh
#   CPU=1 OUT=/tmp/x4 A=... B=... ALL4=... bash bench/gpu/x4_wave.sh          # every step tiny, on gloo
# AB_LEFT (default 400): no step of a stream starts after it, in seconds from this script's start
# (a call ends at 600 s and the archive must come back); no 4-GPU step starts after it either.
set -u
. bench/gpu/device_env.sh
export SITE_READY=1
AB_LEFT=${AB_LEFT:-400}
left() { echo $((AB_LEFT > SECONDS ? AB_LEFT - SECONDS : 0)); }  # x2_wave2.sh's LEFT counts from its own start
stream() {  # NAME GPUS LEFT STEPS...
  local name=$1 gpus=$2 left=$3; shift 3
  mkdir -p "$OUT/$name"
  CUDA_VISIBLE_DEVICES=$gpus OUT=$OUT/$name LEFT=$left bash bench/gpu/x2_wave2.sh "$@" > "$OUT/$name/stream.log" 2>&1
  echo "stream $name ($gpus) rc=$? at ${SECONDS} s" | tee -a "$OUT/x4_steps.txt"
}
[ -n "${CPU:-}" ] && P01=0,1 P23=0,1 P4=0,1,2,3 || { P01=0,1; P23=2,3; P4=0,1,2,3; }
[ -n "${ALL4:-}" ] && stream all4 $P4 "$(left)" $ALL4
[ -n "${A:-}" ] && stream a $P01 "$(left)" $A &
[ -n "${B:-}" ] && stream b $P23 "$(left)" $B &
wait
cd "$OUT" && tar czf x4.tar.gz --remove-files $(ls -d a b all4 x4_steps.txt 2>/dev/null) && ls -la
