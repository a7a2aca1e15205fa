"""The JAX matmul ports' host path beyond XLA's, padded calls against unpadded ones, and the prediction for one
compiled call, from the `shapes` record:

    PYTHONPATH=. python results/h200/experiments/jax-matmul-one-call/predict.py [results/h200/matmul-shapes.json]

A port's host path beyond XLA's is (port's host clock - port's kernels) - (XLA's host clock - XLA's kernels). A
padded case is predicted at XLA's host clock, plus the kernels' difference, plus the median of that figure over the
port's cases that are not padded. Whether a case pads is asked of the ports' tilings as they are now. At every
`shapes` case the answer is the same as under the record's tree (50d6deb, before the wave-aware tiling).
"""
import json
import statistics
import sys

from mosaic_gpu_kernels.matmul import mosaic_tiling, padded_shape
from ports.matmul_common import matmul_tiling

PORTS = ("pallas", "mosaic_gpu")


def pads(port: str, params: dict) -> bool:
    m, n, k = params["m"], params["n"], params["k"]
    if port == "pallas":
        return m % matmul_tiling(m, n).tile_m != 0
    return padded_shape(m, n, k, params["out"], mosaic_tiling(m, n, params["out"]), whole_tiles=False) != (m, n, k)


def main(path: str) -> None:
    cases = {}
    for result in json.load(open(path))["results"]:
        cases.setdefault(result["case"], {})[result["impl"]] = result
    beyond = {port: {True: [], False: []} for port in PORTS}
    for by_impl in cases.values():
        xla = by_impl["jax_xla"]
        for port in PORTS:
            result = by_impl[port]
            extra = (result["median_ms"] - result["kernel_ms"]) - (xla["median_ms"] - xla["kernel_ms"])
            beyond[port][pads(port, result["params"])].append(1e3 * extra)
    print("| port | cases not padded | median (range), us | cases padded | median (range), us |")
    print("|---|---|---|---|---|")
    for port in PORTS:
        cells = []
        for padded in (False, True):
            values = beyond[port][padded]
            cells += [str(len(values)), f"{statistics.median(values):.0f} ({min(values):.0f} to {max(values):.0f})"]
        print(f"| {port} | " + " | ".join(cells) + " |")
    unpadded = {port: statistics.median(beyond[port][False]) / 1e3 for port in PORTS}
    print("\n| M x N x K | XLA host (us) | Pallas now | Pallas predicted | Mosaic GPU now | Mosaic GPU predicted |")
    print("|---|---|---|---|---|---|")
    for by_impl in cases.values():
        xla = by_impl["jax_xla"]
        params = xla["params"]
        if params["m"] > 256:
            continue
        cells = []
        for port in PORTS:
            result = by_impl[port]
            now = result["median_ms"] / xla["median_ms"]
            predicted = (xla["median_ms"] + result["kernel_ms"] - xla["kernel_ms"] + unpadded[port]) / xla["median_ms"]
            cells += [f"{now:.2f}", f"{predicted:.2f}" if pads(port, params) else "(not padded)"]
        print(f"| {params['m']} x {params['n']} x {params['k']} | {1e3 * xla['median_ms']:.0f} | " + " | ".join(cells)
              + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/h200/matmul-shapes.json")
