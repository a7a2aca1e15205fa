#!/usr/bin/env bash
# Issue 53's "nothing moved" runs on one machine: the matmul kernels and the eigh ports at BASE (the tree before the
# house's changes, 6c4f25e, unpacked by `git archive 6c4f25e | tar -x -C BASE`), then at this tree with `--against`
# the first, so that bits and times are compared on the same GPU and versions. Each into DIR, a marker file when it
# ends (a device call starts this with setsid and a later call fetches what has ended).
#
#     bash results/h200/experiments/house/issue53_same_machine.sh BASE DIR   (from the repository's root)
set -uo pipefail
base=${1:?usage: issue53_same_machine.sh BASE DIR}
dir=${2:?usage: issue53_same_machine.sh BASE DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
python=${PYTHON:-python}
matmul=(matmul --cases bench --timer kernels --no-properties)
eigh=(eigh --cases bench --timer host --impl triton,pallas --max-seconds 5)
(cd "$base" && CROSSPORT_COMMIT=6c4f25ed41f6674374621810394ed5c2c5b39f7a $python -m compare "${matmul[@]}" \
    --json "$dir/base-matmul.json" > "$dir/base-matmul.txt" 2>&1)
$python -m compare "${matmul[@]}" --against "$dir/base-matmul.json" --json "$dir/matmul.json" > "$dir/matmul.txt" 2>&1
touch "$dir/1-matmul"
(cd "$base" && CROSSPORT_COMMIT=6c4f25ed41f6674374621810394ed5c2c5b39f7a $python -m compare "${eigh[@]}" \
    --json "$dir/base-eigh.json" > "$dir/base-eigh.txt" 2>&1)
$python -m compare "${eigh[@]}" --against "$dir/base-eigh.json" --json "$dir/eigh.json" > "$dir/eigh.txt" 2>&1
touch "$dir/2-eigh"
