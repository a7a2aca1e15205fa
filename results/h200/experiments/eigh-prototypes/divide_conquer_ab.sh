#!/usr/bin/env bash
# Issue 55's A/B on a GPU, in one driver run: each port as it is (inverse iteration), with divide and conquer
# (EIGENVECTORS changed in a copy of its package), and with divide and conquer and the fixed-weight secular equation
# (secular-fixed-weight*.diff applied to that copy). Every bench case timed by the host clock, every test case
# checked.
#
#     bash results/h200/experiments/eigh-prototypes/divide_conquer_ab.sh [JSON] [PORTS]   (from the repository's root)
#
# PORTS: "triton pallas" (default), or one of them, for a run that fits one device call.
set -euo pipefail
json=${1:-/tmp/eigh-divide-conquer-ab.json}
ports=${2:-triton pallas}
here=results/h200/experiments/eigh-prototypes
variants=()
impls=()
for port in $ports; do
    for kind in dc fw; do
        copy=/tmp/eigh_${kind}_${port}
        rm -rf "$copy"
        cp -r "${port}_kernels/eigh" "$copy"
        sed -i 's/^EIGENVECTORS = "inverse_iteration"/EIGENVECTORS = "divide_conquer"/' "$copy/__init__.py"
        grep -q '^EIGENVECTORS = "divide_conquer"' "$copy/__init__.py"
        variants+=(--variant "${kind}_${port}=${port}:${copy}")
    done
    impls+=("$port" "dc_${port}" "fw_${port}")
    suffix=$([ "$port" = pallas ] && echo -pallas || true)
    patch -s "/tmp/eigh_fw_${port}/divide_conquer.py" < "$here/secular-fixed-weight${suffix}.diff"
done
${PYTHON:-python} -m compare eigh --cases bench,test --impl "$(IFS=,; echo "${impls[*]}")" \
    "${variants[@]}" --timer host --json "$json"
