#!/bin/bash
# The prepared diffs of prepared-order.txt (paths under results/h200/experiments), in that order, as one diff:
#   bash results/h200/experiments/house/all_prepared.sh OUT.diff
# `git apply OUT.diff` applies them all; `ab.sh --prepared OUT.diff ...` times the tree before against the tree with
# all of them. Each diff also applies alone after the ones above it.
set -euo pipefail
here=$(dirname "$0")
: > "$1"
while read -r diff; do
    cat "$here/../$diff" >> "$1"
done < "$here/prepared-order.txt"
