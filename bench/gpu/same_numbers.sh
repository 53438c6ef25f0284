#!/usr/bin/env bash
# Same numbers before and after a change of code: the same sweep run from two source trees, in
# alternating rounds on one machine, then `sweepbench compare` of each pair (the earlier tree as the
# baseline). A tree is a folder holding sweepbench/, conf/ and hydra_plugins/ (e.g. `git archive REV
# sweepbench conf hydra_plugins | tar -x -C DIR`).
#
#   bash bench/gpu/same_numbers.sh BEFORE_TREE AFTER_TREE OUT ROUNDS OVERRIDE...
#
# Writes OUT/before_<r>/, OUT/after_<r>/ (the sweeps) and OUT/compare_<r>.txt (compare's verdicts).
set -uo pipefail
[ $# -ge 5 ] || { echo "usage: same_numbers.sh BEFORE_TREE AFTER_TREE OUT ROUNDS OVERRIDE..." >&2; exit 2; }
before=$(cd "$1" && pwd) after=$(cd "$2" && pwd) out=$3 rounds=$4; shift 4
mkdir -p "$out"; out=$(cd "$out" && pwd)
py=${PYTHON:-python}
for r in $(seq 1 "$rounds"); do
  (cd "$before" && PYTHONPATH="$before${PYTHONPATH:+:$PYTHONPATH}" "$py" -m sweepbench -m "$@" hydra.sweep.dir="$out/before_$r" >"$out/before_$r.log" 2>&1)
  echo "before_$r: exit $?"
  (cd "$after" && PYTHONPATH="$after${PYTHONPATH:+:$PYTHONPATH}" "$py" -m sweepbench -m "$@" hydra.sweep.dir="$out/after_$r" >"$out/after_$r.log" 2>&1)
  echo "after_$r: exit $?"
done
for r in $(seq 1 "$rounds"); do
  (cd "$after" && PYTHONPATH="$after${PYTHONPATH:+:$PYTHONPATH}" "$py" -m sweepbench compare "$out/before_$r" "$out/after_$r") >"$out/compare_$r.txt" 2>&1
  echo "compare_$r: exit $?"; cat "$out/compare_$r.txt"
done
