"""`python -m compare invariance --gpus N`: the tensor-parallel modes' bits on N devices against one, and in any batch.

A Megatron MLP (the up projection column-parallel and left sharded, SiLU, the down projection row-parallel, its output
in float32 as logits are kept) runs a batch of rows in each framework: `batch_invariant.torch_tensor_parallel` on N
processes joined by torch.distributed (NCCL on GPUs, gloo on CPUs), and `batch_invariant.jax_tensor_parallel` under
JAX's mode by `jax.shard_map` over N devices; one device is one process, or a mesh of one. For each framework and each
batch size B of --batches: the N devices' outputs must have one device's bits, and each row of a batch of B the bits
of that row alone. Each is timed at the largest B (the median host time of --repeats calls finished on every device,
after a warm-up call): scaling is the time on one over the time on N. Without GPUs the devices are CPU processes and
JAX's CPU devices through the interpreters, at small sizes: the bits are checked, the times are no speed.
"""
from __future__ import annotations

import json
import os
import shlex
import sys

import numpy as np
import torch

from compare.across_devices import jax_cpu_devices, median_seconds, on_ranks

CPU_SIZES = (64, 128, 48)  # width, hidden, out: the interpreters run them in seconds
GPU_SIZES = (4096, 14336, 4096)  # an 8B model's MLP


def dtype(on_gpu: bool) -> torch.dtype:
    return torch.bfloat16 if on_gpu else torch.float16  # the interpreter misreads bfloat16 (batch_invariant.kernels)


def mlp_weights(sizes, on_gpu: bool, device="cpu"):
    """The MLP's weights, the same in every process: ((up [hidden, width], bias), (down [out, hidden], bias))."""
    width, hidden, out = sizes
    gen = torch.Generator().manual_seed(11)
    up = (torch.randn(hidden, width, generator=gen) / width ** 0.5, torch.randn(hidden, generator=gen))
    down = (torch.randn(out, hidden, generator=gen) / hidden ** 0.5, torch.randn(out, generator=gen))
    return [tuple(t.to(device, dtype(on_gpu)) for t in pair) for pair in (up, down)]


def mlp_rows(sizes, rows: int, on_gpu: bool, device="cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    return torch.randn(rows, sizes[0], generator=gen).to(device, dtype(on_gpu))


def torch_shards(weights, group):
    """This rank's shares of the MLP's weights: up's rows (column-parallel) with its bias, down's columns
    (row-parallel) with the whole bias; taken once, before any call."""
    from batch_invariant.torch_tensor_parallel import shard

    (up_w, up_b), (down_w, down_b) = weights
    return shard(up_w, up_b, "column", group), shard(down_w, down_b, "row", group)


def torch_mlp(x, shards, group):
    """The MLP on x [rows, width] over a torch.distributed group (None: one process), from this rank's `torch_shards`:
    the whole output [rows, out] in float32, on every rank."""
    from batch_invariant.torch_tensor_parallel import column_parallel, row_parallel

    up, down = shards
    with torch.no_grad():
        hidden = column_parallel(x, *up, group, gather=False)
        hidden = torch.nn.functional.silu(hidden.float()).to(x.dtype)  # elementwise: the same bits in any batch
        return row_parallel(hidden, *down, group, dtype=torch.float32)


def jax_mlp(devices: int):
    """The MLP in JAX under its mode, run by shard_map over the first `devices` of JAX's devices (whole inputs in,
    each device taking its share of the weights), jitted: f(x, up_w, up_b, down_w, down_b) -> float32 output; and the
    sharding that places an input whole on every device of the mesh (so that no call copies it there)."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from batch_invariant.jax_mode import batch_invariant
    from batch_invariant.jax_tensor_parallel import column_parallel, row_parallel, shard

    def layer(x, up_w, up_b, down_w, down_b):
        hidden = column_parallel(x, *shard(up_w, up_b, "column", "model"), "model", gather=False)
        hidden = jax.nn.silu(hidden.astype(np.float32)).astype(x.dtype)
        return row_parallel(hidden, *shard(down_w, down_b, "row", "model"), "model", dtype=np.float32)

    mesh = Mesh(np.array(jax.devices()[:devices]), ("model",))
    step = jax.jit(jax.shard_map(batch_invariant(layer), mesh=mesh, in_specs=(PartitionSpec(),) * 5,
                                 out_specs=PartitionSpec(), check_vma=False))
    return step, NamedSharding(mesh, PartitionSpec())


def _outputs(call, x, batches, repeats, group, on_gpu, host):
    """Per B of `batches`: call(x[:B]) on the host (`host` fetches it as NumPy); every row of the largest batch alone;
    the median seconds of a call at the largest batch, finished on every rank of `group` (None: one process)."""
    largest = max(batches)
    found = {"batches": {b: host(call(x[:b])) for b in batches},
             "alone": [host(call(x[i:i + 1])) for i in range(largest)]}
    found["seconds"] = median_seconds(lambda: call(x[:largest]), repeats, group, on_gpu)
    return found


def _torch_on(group, device, sizes, batches, repeats, on_gpu):
    shards = torch_shards(mlp_weights(sizes, on_gpu, device), group)
    x = mlp_rows(sizes, max(batches), on_gpu, device)
    return _outputs(lambda rows: torch_mlp(rows, shards, group), x, batches, repeats, group, on_gpu,
                    lambda output: output.cpu().numpy())


def _torch(devices, sizes, batches, repeats, on_gpu):
    if devices == 1:
        return _torch_on(None, "cuda" if on_gpu else "cpu", sizes, batches, repeats, on_gpu)
    return on_ranks(devices, on_gpu, _torch_on, sizes, batches, repeats, on_gpu)[0]  # every rank holds the output


def _jax(devices, sizes, batches, repeats, on_gpu):
    import jax
    import jax.numpy as jnp

    import batch_invariant.jax_mode as jax_mode

    step, whole = jax_mlp(devices)
    narrow = jnp.bfloat16 if on_gpu else jnp.float16
    weights = [jnp.asarray(t.float().numpy()).astype(narrow) for pair in mlp_weights(sizes, on_gpu) for t in pair]
    x = jnp.asarray(mlp_rows(sizes, max(batches), on_gpu).float().numpy()).astype(narrow)
    weights, x = jax.device_put((weights, x), whole)  # on every device before any call
    ports = jax_mode.PORT_ORDER
    if not on_gpu:  # Mosaic GPU's interpreter fails on several CPU devices at once (docs/findings.md, "Tensor
        jax_mode.PORT_ORDER = ("pallas",)  # parallelism"): the Pallas port's interpreter, as the tests run it
    try:
        return _outputs(lambda rows: step(rows, *weights), x, batches, repeats, None, on_gpu, np.asarray)
    finally:
        jax_mode.PORT_ORDER = ports


def run(devices: int, batches, frameworks, repeats: int, on_gpu: bool) -> tuple[list[dict], bool]:
    """A row a framework: the bits on `devices` devices against one, in any batch, and the scaling; and whether all
    held."""
    sizes = GPU_SIZES if on_gpu else CPU_SIZES
    rows, held = [], True
    for framework in frameworks:
        measure = _torch if framework == "torch" else _jax
        one, many = (measure(n, sizes, batches, repeats, on_gpu) for n in (1, devices))
        same = all(np.array_equal(one["batches"][b], many["batches"][b]) for b in batches)
        any_batch = all(np.array_equal(found["batches"][b][i], found["alone"][i][0])
                        for found in (one, many) for b in batches for i in range(b))
        held &= same and any_batch
        rows.append({"framework": framework, "devices": devices, "sizes": list(sizes), "batches": list(batches),
                     "same_bits_as_one_device": same, "same_bits_in_any_batch": any_batch,
                     "one_device_ms": one["seconds"] * 1e3, "devices_ms": many["seconds"] * 1e3,
                     "scaling": one["seconds"] / many["seconds"]})
    return rows, held


def table(rows) -> str:
    devices = rows[0]["devices"]
    lines = [f"{'framework':9} {f'as on 1':9} {'any batch':9} {'1 ms':>9} {f'{devices} ms':>9} {'scaling':>7}"]
    for row in rows:
        lines.append(f"{row['framework']:9} {'same' if row['same_bits_as_one_device'] else 'DIFFER':9} "
                     f"{'same' if row['same_bits_in_any_batch'] else 'DIFFER':9} {row['one_device_ms']:9.3f} "
                     f"{row['devices_ms']:9.3f} {row['scaling']:7.2f}")
    return "\n".join(lines)


def main_from(args, frameworks: list[str], batches: list[int], argv) -> int:
    """`python -m compare invariance --gpus N` (its parsed `args`): the tensor-parallel MLP's record and table; exit
    1 where a bit moved with the devices or the batch, 2 where this machine has fewer devices."""
    from compare import gpu_or_interpreters

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and JAX share the GPUs
    if args.gpus not in (1, 2, 4, 8):
        print(f"--gpus {args.gpus}: the tensor-parallel linears split over 1, 2, 4 or 8 devices", file=sys.stderr)
        return 2
    on_gpu = gpu_or_interpreters()
    if not on_gpu:
        jax_cpu_devices(args.gpus)
    if on_gpu and torch.cuda.device_count() < args.gpus:
        print(f"--gpus {args.gpus}: {torch.cuda.device_count()} GPUs here", file=sys.stderr)
        return 2
    rows, held = run(args.gpus, batches, frameworks, args.repeats, on_gpu)
    where = torch.cuda.get_device_name() if on_gpu else "CPU processes and JAX CPU devices (interpreted: no speed)"
    print(f"the tensor-parallel MLP {rows[0]['sizes']} on 1 and {args.gpus} devices, batches {batches}: {where}")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"command": shlex.join(["python", "-m", "compare", "invariance",
                                                                *(sys.argv[2:] if argv is None else argv)]),
                                         "device": where, "results": rows}, indent=1) + "\n")
    return 0 if held else 1
