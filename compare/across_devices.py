"""`python -m compare trimul --gpus N`: the TriMul ports that shard across devices, on N devices and on one.

A port's rows i are split evenly over the N devices: the Triton port's `trimul_rows` on N processes joined by
torch.distributed (NCCL on GPUs, gloo on CPUs), the Pallas port's `trimul_sharded` by `jax.shard_map` over N of
JAX's devices. Each case runs on one device (the port's own `trimul`) and on N; the N devices' output must have the
one device's bits and pass the workload's float64 check. Both are timed (the host clock around a call that has
finished on every device, median after a warm-up call): scaling is the time on one over the time on N. Without GPUs
the devices are CPU processes and JAX's CPU devices, through the interpreters: the bits are checked, the times are no
speed. A case whose padded N does not split into rows that fill the kernels' tiles is skipped, and said so, as is
one a port's range check refuses (x beyond its float16 intermediates' range) on one device and on N alike; a refusal
on one side only fails. The torch ports' checked call passes host_check=True, so that a refusal is an error to
catch, not a device-side assertion that ends the process's CUDA context.
"""
from __future__ import annotations

import datetime
import inspect
import json
import os
import pathlib
import sys
import tempfile

import torch

from compare.timing import median_after_warm_up, wait_for

HOW = {"torch": "torch.distributed, one process a device", "jax": "jax.shard_map over a mesh axis"}


def sharded_ports() -> dict:
    """The TriMul implementations registered as sharding by rows (`ports.trimul.SHARDED_BY_ROWS`), by name."""
    from ports import trimul as spec

    return {name: spec.WORKLOAD.implementation(name) for name in spec.SHARDED_BY_ROWS}


def checked_call(function) -> dict:
    """The keyword of a checked call: host_check=True where the port takes it (the torch TriMul ports), so that a
    refusal is Float16RangeError to catch, not a device-side assertion that ends the process's CUDA context."""
    return {"host_check": True} if "host_check" in inspect.signature(function).parameters else {}


def _skipped(refusal: ValueError) -> dict:
    """A case the port refused on N devices: the reason, and whether it is the range check's (Float16RangeError, which
    one device must give too), not a split the rows cannot take."""
    from kernel_support.trimul_common import Float16RangeError

    return {"skipped": str(refusal), "range": isinstance(refusal, Float16RangeError)}


def _device_count(impl, on_gpu: bool, devices: int) -> int:
    """The devices this machine gives the port (on a CPU, processes: as many as asked)."""
    if impl.framework == "torch":
        return torch.cuda.device_count() if on_gpu else devices
    import jax

    return len(jax.devices())


def _rank(rank, devices, init_file, out_dir, on_gpu, work, args):
    """One of `on_ranks`'s processes: joined to the others, `work(group, device, *args)` saved as rank{rank}.pt."""
    import torch.distributed as dist

    from compare import gpu_or_interpreters

    gpu_or_interpreters()
    if on_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=devices, timeout=datetime.timedelta(seconds=300))
    try:
        found = work(dist.group.WORLD, f"cuda:{rank}" if on_gpu else "cpu", *args)
        torch.save(found, pathlib.Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def on_ranks(devices: int, on_gpu: bool, work, *args) -> list:
    """`work(group, device, *args)` (a module-level function) on `devices` processes joined by torch.distributed,
    one a GPU over NCCL, or on the CPU over gloo; each rank's result, in rank order."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(devices, os.path.join(folder, "init"), folder, on_gpu, work, args), nprocs=devices,
                 join=True)
        return [torch.load(pathlib.Path(folder) / f"rank{rank}.pt", weights_only=False) for rank in range(devices)]


def median_seconds(call, calls: int, group, on_gpu: bool) -> float:
    """The median host time of `calls` calls of `call()` after one untimed call, each finished on every rank of
    `group` (None: one process): the ranks meet before the clock starts, and again before it stops."""
    import torch.distributed as dist

    return median_after_warm_up(lambda: wait_for(call(), on_gpu), calls,
                                meet=None if group is None else lambda: dist.barrier(group))


def jax_cpu_devices(count: int) -> None:
    """Give JAX `count` CPU devices (XLA_FLAGS), where it has not started yet: without GPUs, a mesh's devices."""
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"


def _rank_rows(group, device, name, cases, calls, on_gpu):
    """This rank's rows of each case by the torch port `name`, and the median time of a call finished on every rank;
    or the refusal."""
    from ports import trimul as spec

    rows_of = sharded_ports()[name].load(spec.SHARDED_BY_ROWS[name])
    found = []
    for case in cases:
        data = spec.make_inputs(case, case["seed"], device)
        try:
            rows = rows_of(data, group, **checked_call(rows_of))
        except ValueError as refusal:  # every rank refuses alike
            found.append(_skipped(refusal))
            continue
        found.append({"rows": rows.cpu(), "seconds": median_seconds(lambda: rows_of(data, group), calls, group,
                                                                     on_gpu)})
    return found


def _torch_on(name, devices, cases, calls, on_gpu):
    """Per case: the output of `devices` ranks assembled from their rows, and the median seconds; or a skip."""
    ranks = on_ranks(devices, on_gpu, _rank_rows, name, cases, calls, on_gpu)
    return [per_rank[0] if "skipped" in per_rank[0] else
            {"output": torch.cat([found["rows"] for found in per_rank], dim=1), "seconds": per_rank[0]["seconds"]}
            for per_rank in zip(*ranks)]


def _jax_on(name, devices, cases, calls, on_gpu):
    """Per case: the JAX port `name`'s output on `devices` devices and the median seconds; or a skip. x and the mask
    are placed on the mesh by rows before the clock starts where the sequence splits evenly unpadded (every bench
    case); a padded one is padded and spread from one device within each timed call, as the port takes it."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from ports import to_framework
    from ports import trimul as spec

    sharded = sharded_ports()[name].load(spec.SHARDED_BY_ROWS[name])
    mesh = Mesh(np.array(jax.devices()[:devices]), ("rows",))
    by_rows = NamedSharding(mesh, PartitionSpec(None, "rows"))
    found = []
    for case in cases:
        device = "cuda" if on_gpu else "cpu"
        x, mask, weights, config = to_framework("jax", spec.make_inputs(case, case["seed"], device))
        if x.shape[1] % devices == 0:
            x, mask = jax.device_put((x, mask), by_rows)
        data = (x, mask, jax.device_put(weights, NamedSharding(mesh, PartitionSpec())), config)
        try:
            output = sharded(data, mesh, "rows")
        except ValueError as refusal:
            found.append(_skipped(refusal))
            continue
        found.append({"output": torch.from_numpy(np.array(output)),  # gathered to the host
                      "seconds": median_seconds(lambda: sharded(data, mesh, "rows"), calls, None, on_gpu)})
    return found


def _one_device(impl, cases, calls, on_gpu):
    """Per case: the port's own function on one device, its output (kept on the CPU, leaving the GPU to the ranks)
    and median seconds; or the refusal."""
    from kernel_support.trimul_common import Float16RangeError
    from ports import to_framework, to_torch
    from ports import trimul as spec

    trimul = impl.load()
    found = []
    for case in cases:
        framed = to_framework(impl.framework, spec.make_inputs(case, case["seed"], "cuda" if on_gpu else "cpu"))
        try:
            output = to_torch(trimul(framed, **checked_call(trimul))).cpu()
        except Float16RangeError as refusal:
            found.append({"skipped": str(refusal)})
            continue
        found.append({"output": output, "seconds": median_seconds(lambda: trimul(framed), calls, None, on_gpu)})
    return found


def run(impls, cases, devices: int, calls: int, on_gpu: bool, json_path=None) -> int:
    """Every port of `impls` on `devices` devices and on one, a row a case; exit status 1 where one's bits or check
    fail, 2 where this machine has too few devices."""
    from ports import trimul as spec

    ports = sharded_ports()
    for impl in impls:
        here = _device_count(ports[impl], on_gpu, devices)
        if here < devices:
            print(f"{impl}: {devices} devices asked for, {here} here", file=sys.stderr)
            return 2
    where = torch.cuda.get_device_name() if on_gpu else "CPU processes and JAX CPU devices (interpreted: no speed)"
    print(f"trimul on 1 and {devices} devices: {where}")
    print(f"{'case':36} {'impl':7} {'bits':10} {'check':6} {'1 ms':>9} {f'{devices} ms':>9} {'scaling':>7}")
    rows, failed = [], False
    for impl in impls:
        alone = _one_device(ports[impl], [case for _, case in cases], calls, on_gpu)
        spread_over = _torch_on if ports[impl].framework == "torch" else _jax_on
        spread = spread_over(impl, devices, [case for _, case in cases], calls, on_gpu)
        for (case_set, case), one, many in zip(cases, alone, spread):
            row = {"case_set": case_set, "case": spec.case_name(case), "impl": impl, "devices": devices}
            alone_refused = "skipped" in one  # the range check's refusal: one device runs any split
            if (alone_refused and "skipped" not in many) or (not alone_refused and many.get("range")):
                where = "one device" if alone_refused else f"{devices} devices"
                refusal = (one if alone_refused else many)["skipped"]
                row["failed"] = f"the range check refused it on {where} only: {refusal}"
                failed = True
                print(f"{row['case']:36} {impl:7} FAILED: {row['failed']}")
            elif "skipped" in many:
                row["skipped"] = many["skipped"]
                print(f"{row['case']:36} {impl:7} skipped: {row['skipped']}")
            else:
                row["one_device_ms"] = one["seconds"] * 1e3
                data = spec.make_inputs(case, case["seed"], "cuda" if on_gpu else "cpu")  # the float64 check's
                check = spec.check(data, many["output"].to(data[0].device), spec.reference(data))
                row.update(bitwise_equal=bool(torch.equal(many["output"], one["output"])), check=check.passed,
                           devices_ms=many["seconds"] * 1e3, scaling=one["seconds"] / many["seconds"])
                failed |= not (row["bitwise_equal"] and row["check"])
                print(f"{row['case']:36} {impl:7} {'same' if row['bitwise_equal'] else 'DIFFER':10} "
                      f"{'pass' if row['check'] else 'FAIL':6} {row['one_device_ms']:9.3f} {row['devices_ms']:9.3f} "
                      f"{row['scaling']:7.2f}")
            rows.append(row)
    if json_path:
        pathlib.Path(json_path).write_text(json.dumps({"workload": "trimul", "devices": devices, "device": where,
                                                       "results": rows}, indent=1) + "\n")
    if all("skipped" in row for row in rows):
        print(f"no case ran on {devices} devices: nothing was compared", file=sys.stderr)
        return 1
    return 1 if failed else 0
