#!/usr/bin/env bash
# Run the cases of one case file as streams side by side, each on its own GPUs (a 4-GPU machine runs
# the 2-GPU cases as two streams), within one deadline; each stream appends every finished case to
# its own tar file under ARCHIVE_DIR, so what ended is kept if the deadline stops the rest.
#
#   bash bench/gpu/streams.sh CASEFILE OUT ARCHIVE_DIR DEADLINE_S GPUS:CASE[,CASE...] [GPUS:CASE[,CASE...] ...]
#   e.g. bash bench/gpu/streams.sh bench/gpu/pages_2gpu.yaml /tmp/p2 $OUT 540 0,1:attention_cp2_mha 2,3:attention_cp2_gqa8
#
# A case already finished in OUT (a results.csv and no job left to run) is run again as a resume,
# which runs only its jobs that did not end: a second call continues a first that the deadline stopped.
set -uo pipefail
[ $# -ge 5 ] || { echo "usage: streams.sh CASEFILE OUT ARCHIVE_DIR DEADLINE_S GPUS:CASE[,CASE...] ..." >&2; exit 2; }
cases=$1 out=$2 archive=$3 deadline=$4; shift 4
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" "$archive"
pids=() i=0
for stream in "$@"; do
  gpus=${stream%%:*} names=${stream#*:} i=$((i + 1))
  args=(); IFS=, read -ra list <<< "$names"; for n in "${list[@]}"; do args+=(--case "$n"); done
  CUDA_VISIBLE_DEVICES=$gpus python "$here/run_cases.py" "$cases" --out "$out" "${args[@]}" \
    --archive "$archive/stream_$i.tar" --deadline "$deadline" > "$archive/stream_$i.log" 2>&1 &
  pids+=($!)
  echo "stream $i on GPUs $gpus: ${list[*]} (pid $!)"
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
for f in "$archive"/stream_*.log; do echo "== $f"; grep -E "^[a-zA-Z0-9_.-]+: (exit|not run)|passed|stopped" "$f"; done
exit $rc
