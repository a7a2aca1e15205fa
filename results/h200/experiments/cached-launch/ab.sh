#!/bin/bash
# A workload's cases timed under the code before a change and after it, on one GPU in one call:
#   bash results/h200/experiments/cached-launch/ab.sh CHANGE.diff OUT WORKLOAD CASES IMPLS
# e.g. ab.sh change.diff $OUT matmul shapes triton,gluon,torch. CHANGE.diff is the change (`git diff BEFORE AFTER --
# ports triton_kernels gluon_kernels pallas_kernels`), reversed in a copy of the tree for the "before" run; the
# "after" run is compared with it (--against). Writes OUT/WORKLOAD-{before,after}.{json,txt}.
set -euo pipefail
change=$(realpath "$1"); out=$2; workload=$3; cases=$4; impls=$5
before=$(mktemp -d)/tree
cp -r . "$before"
(cd "$before" && git apply -R "$change")
(cd "$before" && python -m compare "$workload" --cases "$cases" --impl "$impls" --timer all --no-properties \
    --json "$out/$workload-before.json" > "$out/$workload-before.txt" 2>&1)
python -m compare "$workload" --cases "$cases" --impl "$impls" --timer all --json "$out/$workload-after.json" \
    --against "$out/$workload-before.json" > "$out/$workload-after.txt" 2>&1 || echo "$workload after: exit $?"
grep -A12 "geometric means" "$out/$workload-after.txt" | head -12
