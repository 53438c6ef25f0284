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
in_tree() {  # TREE ARGS...: `python -m sweepbench ARGS` with TREE's code and config
  local tree=$1; shift
  (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" "$py" -m sweepbench "$@")
}
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    tree=$before; [ "$side" = after ] && tree=$after
    in_tree "$tree" -m "$@" hydra.sweep.dir="$out/${side}_$r" >"$out/${side}_$r.log" 2>&1
    echo "${side}_$r: exit $?"
  done
done
for r in $(seq 1 "$rounds"); do
  in_tree "$after" compare "$out/before_$r" "$out/after_$r" >"$out/compare_$r.txt" 2>&1
  echo "compare_$r: exit $?"; cat "$out/compare_$r.txt"
done
