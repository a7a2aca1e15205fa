#!/bin/bash
# A workload's cases timed under the code before a change and after it, on one GPU in one call:
#   bash results/h200/experiments/cached-launch/ab.sh [--prepared] CHANGE.diff OUT WORKLOAD CASES IMPLS
# e.g. ab.sh change.diff $OUT matmul shapes triton,gluon,torch. CHANGE.diff is a change (`git diff BEFORE AFTER --
# ports triton_kernels gluon_kernels pallas_kernels`, or a prepared diff). Without --prepared the tree holds the
# change, and a copy with it reversed runs "before"; with --prepared the tree runs "before", and a copy with the
# change applied runs "after". The "after" run is compared with the "before" one (--against). Writes
# OUT/WORKLOAD-{before,after}.{json,txt}. Do not export CROSSPORT_COMMIT into it: both runs would record that commit.
set -euo pipefail
prepared=0
if [ "${1:-}" = "--prepared" ]; then prepared=1; shift; fi
change=$(realpath "$1"); out=$(realpath "$2"); workload=$3; cases=$4; impls=$5
copy=$(mktemp -d)/tree
cp -r . "$copy"
if [ $prepared = 1 ]; then
    (cd "$copy" && git apply "$change"); before=.; after=$copy
else
    (cd "$copy" && git apply -R "$change"); before=$copy; after=.
fi
(cd "$before" && python -m compare "$workload" --cases "$cases" --impl "$impls" --timer all --no-properties \
    --json "$out/$workload-before.json" > "$out/$workload-before.txt" 2>&1)
(cd "$after" && python -m compare "$workload" --cases "$cases" --impl "$impls" --timer all \
    --json "$out/$workload-after.json" --against "$out/$workload-before.json" > "$out/$workload-after.txt" 2>&1) \
    || echo "$workload after: exit $?"
grep -A12 "geometric means" "$out/$workload-after.txt" | head -12
