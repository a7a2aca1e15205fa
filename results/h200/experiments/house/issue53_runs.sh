#!/usr/bin/env bash
# Issue 53's regression runs on a GPU, one after another, each into DIR with a marker file when it ends (so that a
# device call can start this with setsid and a later call fetch what has ended):
#   1-range-check: each TriMul kernel port against itself without the fp16 range check (range_check_ab.sh);
#   2-trimul-test: TriMul's test set, every implementation (its n = 1024, dim 768 case ran out of memory at 6b246fe);
#   3-eigh: the eigh ports against results/h200/eigh.json (its library baseline is named jax there, jax_xla now: no
#   baseline in common, so another host's host path would show as the ports' move);
#   4-matmul: the matmul kernels against results/h200/matmul-kernel-times.json.
#
#     bash results/h200/experiments/house/issue53_runs.sh DIR   (from the repository's root)
set -uo pipefail
dir=${1:?usage: issue53_runs.sh DIR}
mkdir -p "$dir"
python=${PYTHON:-python}
bash results/h200/experiments/house/range_check_ab.sh "$dir/trimul-range-check-ab.json" > "$dir/range-check.txt" 2>&1
touch "$dir/1-range-check"
$python -m compare trimul --cases test --json "$dir/trimul-test.json" > "$dir/trimul-test.txt" 2>&1
touch "$dir/2-trimul-test"
$python -m compare eigh --timer host --impl triton,pallas --against results/h200/eigh.json \
    --json "$dir/eigh.json" > "$dir/eigh.txt" 2>&1
touch "$dir/3-eigh"
$python -m compare matmul --timer kernels --against results/h200/matmul-kernel-times.json \
    --json "$dir/matmul.json" > "$dir/matmul.txt" 2>&1
touch "$dir/4-matmul"
