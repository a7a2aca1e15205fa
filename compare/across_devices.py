"""`python -m compare trimul --gpus N`: the TriMul ports that shard across devices, on N devices and on one.

A port's rows i are split evenly over the N devices: the Triton port's `trimul_rows` on N processes joined by
torch.distributed (NCCL on GPUs, gloo on CPUs), the Pallas port's `trimul_sharded` by `jax.shard_map` over N of
JAX's devices. Each case runs on one device (the port's own `trimul`) and on N; the N devices' output must have the
one device's bits and pass the workload's float64 check. Both are timed (the host clock around a call that has
finished on every device, median after a warm-up call): scaling is the time on one over the time on N. Without GPUs
the devices are CPU processes and JAX's CPU devices, through the interpreters: the bits are checked, the times are no
speed. A case whose padded N does not split into rows that fill the kernels' tiles is skipped, and said so.
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import sys
import tempfile

import torch

from compare.timing import median_after_warm_up, wait_for

SHARDED = {"triton": "torch.distributed, one process a device", "pallas": "jax.shard_map over a mesh axis"}


def _device_count(impl: str, on_gpu: bool, devices: int) -> int:
    """The devices this machine gives the port (on a CPU, processes: as many as asked)."""
    if impl == "triton":
        return torch.cuda.device_count() if on_gpu else devices
    import jax

    return len(jax.devices())


def _torch_rank(rank, devices, init_file, out_dir, cases, calls, on_gpu):
    """One process of `devices`: each case's rows of this rank and the median time of a call finished on every rank;
    saved as rank{rank}.pt."""
    import torch.distributed as dist

    from compare import gpu_or_interpreters
    from ports import trimul as spec

    gpu_or_interpreters()
    from triton_kernels.trimul import trimul_rows

    device = f"cuda:{rank}" if on_gpu else "cpu"
    if on_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=devices, timeout=datetime.timedelta(seconds=300))
    found = []
    try:
        for case in cases:
            data = spec.make_inputs(case, case["seed"], device)
            try:
                rows = trimul_rows(data, dist.group.WORLD)
            except ValueError as refusal:  # every rank refuses alike, before any collective
                found.append({"skipped": str(refusal)})
                continue

            def call():
                dist.barrier()
                wait_for(trimul_rows(data, dist.group.WORLD), on_gpu)
                dist.barrier()

            found.append({"rows": rows.cpu(), "seconds": median_after_warm_up(call, calls)})
        torch.save(found, pathlib.Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _triton_on(devices, cases, calls, on_gpu):
    """Per case: the output of `devices` ranks assembled from their rows, and the median seconds; or a skip."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_torch_rank, args=(devices, os.path.join(folder, "init"), folder, cases, calls, on_gpu),
                 nprocs=devices, join=True)
        ranks = [torch.load(pathlib.Path(folder) / f"rank{rank}.pt") for rank in range(devices)]
    return [per_rank[0] if "skipped" in per_rank[0] else
            {"output": torch.cat([found["rows"] for found in per_rank], dim=1), "seconds": per_rank[0]["seconds"]}
            for per_rank in zip(*ranks)]


def _pallas_on(devices, cases, calls, on_gpu):
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from pallas_kernels.trimul import trimul_sharded
    from ports import to_framework
    from ports import trimul as spec

    mesh = Mesh(np.array(jax.devices()[:devices]), ("rows",))
    found = []
    for case in cases:
        data = to_framework("jax", spec.make_inputs(case, case["seed"], "cuda" if on_gpu else "cpu"))
        try:
            output = trimul_sharded(data, mesh, "rows")
        except ValueError as refusal:
            found.append({"skipped": str(refusal)})
            continue
        seconds = median_after_warm_up(lambda: wait_for(trimul_sharded(data, mesh, "rows"), on_gpu), calls)
        found.append({"output": torch.from_numpy(np.array(output)), "seconds": seconds})  # gathered to the host
    return found


def _one_device(impl, cases, calls, on_gpu):
    """Per case: the port's own `trimul` on one device, its output (as torch) and median seconds, and the inputs."""
    from ports import to_framework, to_torch
    from ports import trimul as spec

    if impl == "triton":
        from triton_kernels.trimul import trimul
    else:
        from pallas_kernels.trimul import trimul
    found = []
    for case in cases:
        data = spec.make_inputs(case, case["seed"], "cuda" if on_gpu else "cpu")
        framed = to_framework("torch" if impl == "triton" else "jax", data)
        output = to_torch(trimul(framed))
        seconds = median_after_warm_up(lambda: wait_for(trimul(framed), on_gpu), calls)
        found.append({"data": data, "output": output, "seconds": seconds})
    return found


def run(impls, cases, devices: int, calls: int, on_gpu: bool, json_path=None) -> int:
    """Every port of `impls` on `devices` devices and on one, a row a case; exit status 1 where one's bits or check
    fail, 2 where this machine has too few devices."""
    from ports import trimul as spec

    for impl in impls:
        here = _device_count(impl, on_gpu, devices)
        if here < devices:
            print(f"{impl}: {devices} devices asked for, {here} here", file=sys.stderr)
            return 2
    where = torch.cuda.get_device_name() if on_gpu else "CPU processes and JAX CPU devices (interpreted: no speed)"
    print(f"trimul on 1 and {devices} devices: {where}")
    print(f"{'case':36} {'impl':7} {'bits':10} {'check':6} {'1 ms':>9} {f'{devices} ms':>9} {'scaling':>7}")
    rows, failed = [], False
    for impl in impls:
        alone = _one_device(impl, [case for _, case in cases], calls, on_gpu)
        spread = (_triton_on if impl == "triton" else _pallas_on)(devices, [case for _, case in cases], calls, on_gpu)
        for (case_set, case), one, many in zip(cases, alone, spread):
            row = {"case_set": case_set, "case": spec.case_name(case), "impl": impl, "devices": devices,
                   "one_device_ms": one["seconds"] * 1e3}
            if "skipped" in many:
                row["skipped"] = many["skipped"]
                print(f"{row['case']:36} {impl:7} skipped: {many['skipped']}")
            else:
                output = many["output"].to(one["output"].device)
                check = spec.check(one["data"], output, spec.reference(one["data"]))
                row.update(bitwise_equal=bool(torch.equal(output, one["output"])), check=check.passed,
                           devices_ms=many["seconds"] * 1e3, scaling=one["seconds"] / many["seconds"])
                failed |= not (row["bitwise_equal"] and row["check"])
                print(f"{row['case']:36} {impl:7} {'same' if row['bitwise_equal'] else 'DIFFER':10} "
                      f"{'pass' if row['check'] else 'FAIL':6} {row['one_device_ms']:9.3f} {row['devices_ms']:9.3f} "
                      f"{row['scaling']:7.2f}")
            rows.append(row)
    if json_path:
        pathlib.Path(json_path).write_text(json.dumps({"workload": "trimul", "devices": devices, "device": where,
                                                       "results": rows}, indent=1) + "\n")
    return 1 if failed else 0
