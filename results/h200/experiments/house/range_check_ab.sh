#!/usr/bin/env bash
# Issue 53's TriMul regression check as an A/B in one driver run: each TriMul kernel port as it is, and a copy of its
# module without the call to its range check, `refuse_flagged` or `refuse_non_finite` (the check's synchronisation;
# the torch ports' flags and the JAX ports' column sum are still computed, unread). The host clock, the kernels and the
# call from torch, on every bench case.
#
#     bash results/h200/experiments/house/range_check_ab.sh [JSON] [CASES]   (from the repository's root)
set -euo pipefail
json=${1:-/tmp/trimul-range-check-ab.json}
cases=${2:-bench}
variants=()
impls=()
for port in triton gluon pallas mosaic_gpu; do
    copy=/tmp/trimul_unchecked_${port}.py
    # the first call only: the port's `trimul` (triton_kernels/trimul.py's `trimul_rows`, after it, keeps its own)
    sed '0,/^    refuse_\(non_finite\|flagged\)(/{//d}' "${port}_kernels/trimul.py" > "$copy"
    cmp -s "$copy" "${port}_kernels/trimul.py" && { echo "no range check found in ${port}_kernels/trimul.py"; exit 1; }
    variants+=(--variant "unchecked_${port}=${port}:${copy}")
    impls+=("$port" "unchecked_${port}")
done
${PYTHON:-python} -m compare trimul --cases "$cases" --timer all --impl "$(IFS=,; echo "${impls[*]}")" \
    "${variants[@]}" --json "$json"
