#!/usr/bin/env bash
# Issue 55's A/B on a GPU, in one driver run: each port as it is (inverse iteration), with divide and conquer
# (EIGENVECTORS changed in a copy of its package), and with divide and conquer and the fixed-weight secular equation
# (secular-fixed-weight*.diff applied to that copy). Every bench case timed by the host clock, every test case
# checked.
#
#     bash results/h200/experiments/eigh-prototypes/divide_conquer_ab.sh [JSON]   (from the repository's root)
set -euo pipefail
json=${1:-/tmp/eigh-divide-conquer-ab.json}
here=results/h200/experiments/eigh-prototypes
variants=()
for port in triton pallas; do
    for kind in dc fw; do
        copy=/tmp/eigh_${kind}_${port}
        rm -rf "$copy"
        cp -r "${port}_kernels/eigh" "$copy"
        sed -i 's/^EIGENVECTORS = "inverse_iteration"/EIGENVECTORS = "divide_conquer"/' "$copy/__init__.py"
        grep -q '^EIGENVECTORS = "divide_conquer"' "$copy/__init__.py"
        variants+=(--variant "${kind}_${port}=${port}:${copy}")
    done
    suffix=$([ "$port" = pallas ] && echo -pallas || true)
    patch -s "/tmp/eigh_fw_${port}/divide_conquer.py" < "$here/secular-fixed-weight${suffix}.diff"
done
${PYTHON:-python} -m compare eigh --cases bench,test --impl triton,dc_triton,fw_triton,pallas,dc_pallas,fw_pallas \
    "${variants[@]}" --timer host --json "$json"
