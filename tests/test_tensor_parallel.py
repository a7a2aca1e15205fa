"""Tensor-parallel linears (`batch_invariant.torch_tensor_parallel`, `batch_invariant.jax_tensor_parallel`): the same
bits on 1, 2 and 4 ranks, and for a row in any batch, on CPU processes joined by gloo and on JAX's CPU devices."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import batch_invariant.torch_mode as bi
from batch_invariant import TENSOR_PARALLEL_PARTS, NotCovered, row_parallel_pieces, tensor_parallel_share
from batch_invariant.torch_tensor_parallel import column_parallel, row_parallel, shard

from compare.across_devices import on_ranks
from compare.invariance.tensor_parallel import CPU_SIZES, mlp_rows, torch_mlp, torch_shards
from compare.invariance.tensor_parallel import mlp_weights as tensor_parallel_weights

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float16  # the interpreter misreads bfloat16 (batch_invariant.kernels._check)
WIDTH = CPU_SIZES[0]


def mlp_weights(device=DEVICE):
    """The Megatron MLP's weights of `compare.invariance.tensor_parallel`, in float16, the same on every rank."""
    return tensor_parallel_weights(CPU_SIZES, False, device)


def mlp(x, group):
    """up column-parallel (this rank's features, not gathered), silu, down row-parallel: the whole output, in
    float32 (as logits are kept), where a sum in another order shows in its last bits."""
    return torch_mlp(x, torch_shards(mlp_weights(x.device), group), group)


def batch_and_rows(device=DEVICE):
    return mlp_rows(CPU_SIZES, 7, False, device)


def outputs(group, device=DEVICE):
    """The MLP on a batch of 7 rows, on its first 3 and on its row 4 alone; and its up projection gathered."""
    x = batch_and_rows(device)
    (up_w, up_b), _ = mlp_weights(device)
    with torch.no_grad():
        return (mlp(x, group), mlp(x[:3], group), mlp(x[4:5], group),
                column_parallel(x, *shard(up_w, up_b, "column", group), group))


def mlp_float64(x):
    """The MLP in float64, unsplit: the reference both frameworks' outputs are held to."""
    (up_w, up_b), (down_w, down_b) = mlp_weights()
    linear = torch.nn.functional.linear
    return linear(torch.nn.functional.silu(linear(x.double(), up_w.double(), up_b.double())), down_w.double(),
                  down_b.double())


@pytest.mark.skipif(DEVICE == "cuda", reason="ranks as CPU processes through the interpreter: one GPU holds one rank")
def test_the_mlp_has_the_same_bits_on_one_two_and_four_ranks_and_in_any_batch():
    alone = outputs(None)
    batch, first_three, row_four, _ = alone
    assert torch.equal(batch[:3], first_three) and torch.equal(batch[4:5], row_four)  # in any batch
    expected = mlp_float64(batch_and_rows())
    assert float((batch.double() - expected).abs().max()) < 2e-2 * float(expected.abs().max())  # and right
    for ranks in (2, 4):
        for rank, results in enumerate(on_ranks(ranks, False, outputs)):
            assert all(torch.equal(a, b) for a, b in zip(results, alone)), (ranks, rank)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_column_parallel_has_the_mode_linears_bits(with_bias):
    x = batch_and_rows().reshape(7, 1, WIDTH)  # 3-d, contiguous: F.linear's addmm
    (up_w, up_b), _ = mlp_weights()
    bias = up_b if with_bias else None
    with torch.no_grad(), bi.batch_invariant():
        assert torch.equal(column_parallel(x, up_w, bias, None), torch.nn.functional.linear(x, up_w, bias))


def test_what_a_tensor_parallel_linear_cannot_take_is_named():
    x = batch_and_rows()
    (up_w, up_b), _ = mlp_weights()
    with pytest.raises(ValueError, match="inference"):
        column_parallel(x.clone().requires_grad_(), up_w, up_b, None)
    with pytest.raises(ValueError, match=f"divisible by {TENSOR_PARALLEL_PARTS}"):
        row_parallel(torch.zeros(2, 12, dtype=DTYPE, device=DEVICE), torch.zeros(4, 12, dtype=DTYPE, device=DEVICE),
                     None, None)
    with pytest.raises(ValueError, match="'column' or 'row'"):
        shard(up_w, up_b, "diagonal", None)
    with pytest.raises(NotCovered, match="not covered"):
        column_parallel(x.float(), up_w.float(), None, None)
    with pytest.raises(ValueError, match="inference"):
        column_parallel(x, up_w.clone().requires_grad_(), up_b, None)
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        tensor_parallel_share(up_w.shape, "column", 3)
    with pytest.raises(ValueError, match="1, 2, 4 or 8 ranks"):
        row_parallel_pieces(WIDTH, 3)


def jax_mlp(x, weights, ranks):
    """The same MLP in JAX (`compare.invariance.tensor_parallel.jax_mlp`) over `ranks` of the CPU's devices, its
    output in float32; and its up projection alone, column-parallel and gathered."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    from batch_invariant.jax_mode import batch_invariant
    from batch_invariant.jax_tensor_parallel import column_parallel, shard
    from compare.invariance.tensor_parallel import jax_mlp as jax_tensor_parallel_mlp

    def up(x, up_w, up_b):
        return column_parallel(x, *shard(up_w, up_b, "column", "model"), "model")

    mesh = Mesh(np.array(jax.devices()[:ranks]), ("model",))
    gathered = jax.jit(jax.shard_map(batch_invariant(up), mesh=mesh, in_specs=(PartitionSpec(),) * 3,
                                     out_specs=PartitionSpec(), check_vma=False))
    return np.asarray(jax_tensor_parallel_mlp(ranks)[0](x, *weights)), np.asarray(gathered(x, *weights[:2]))


def jax_ranks_main():
    """Run in a process with 4 CPU devices (XLA_FLAGS): the JAX MLP's bits on 1, 2 and 4 devices and in any batch;
    exit status 1 with the reason where one differs. On the Pallas port: Mosaic GPU's interpreter, run on several
    CPU devices at once, fails now and then with a barrier left allocated (docs/findings.md, "Tensor parallelism")."""
    import sys

    import jax.numpy as jnp
    import numpy as np

    import batch_invariant.jax_mode as jax_mode

    jax_mode.PORT_ORDER = ("pallas",)

    x = jnp.asarray(batch_and_rows().cpu().numpy())
    weights = [jnp.asarray(t.cpu().numpy()) for pair in mlp_weights() for t in pair]
    alone, gathered = jax_mlp(x, weights, 1)
    failures = []
    expected = mlp_float64(batch_and_rows()).cpu().numpy()
    if np.abs(alone - expected).max() > 2e-2 * np.abs(expected).max():
        failures.append(f"one device: off the float64 MLP by {np.abs(alone - expected).max()}")
    if not (jax_mlp(x[:3], weights, 1)[0] == alone[:3]).all():
        failures.append("one device: the first 3 rows alone differ from the batch's")
    for ranks in (2, 4):
        output, up = jax_mlp(x, weights, ranks)
        if not ((output == alone).all() and (up == gathered).all()):
            failures.append(f"{ranks} devices differ from one")
    sys.exit("; ".join(failures) or 0)


@pytest.mark.skipif(DEVICE == "cuda", reason="devices as the CPU's, through the interpreters: one GPU holds one rank")
def test_the_jax_mlp_has_the_same_bits_on_one_two_and_four_devices_and_in_any_batch():
    done = in_a_process_with_four_cpu_devices("jax_ranks_main")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def _trimul_rows_of(group, device, case):
    from ports import trimul as spec
    from triton_kernels.trimul import trimul_rows

    return trimul_rows(spec.make_inputs(case, case["seed"], "cpu"), group, poison=True)


@pytest.mark.skipif(DEVICE == "cuda", reason="ranks as CPU processes through the interpreter: one GPU holds one rank")
def test_trimul_sharded_by_rows_has_one_ranks_bits():
    # the Triton port's rows split over 1, 2 and 4 ranks: each rank's rows are trimul's, bit for bit; N = 30 is
    # padded to 32 (the last rank's padded rows cut), with a mask
    from ports import trimul as spec
    from triton_kernels.trimul import trimul

    case = dict(seqlen=30, bs=2, dim=32, hiddendim=32, seed=17, nomask=False, distribution="normal")
    whole = trimul(spec.make_inputs(case, case["seed"], "cpu"))
    assert torch.equal(_trimul_rows_of(None, "cpu", case), whole)
    for ranks in (2, 4):
        rows = on_ranks(ranks, False, _trimul_rows_of, case)
        assert torch.equal(torch.cat(rows, dim=1), whole), ranks


def jax_trimul_main():
    """Run in a process with 4 CPU devices (XLA_FLAGS): the Pallas port's TriMul sharded by rows over 1, 2 and 4
    devices has `trimul`'s bits (N = 30 padded to 32, with a mask); 3 devices are refused by name, and x whose
    LayerNorm passes float32's range on every device; exit status 1 with the reasons where one fails."""
    import sys

    import jax
    import numpy as np
    from jax.sharding import Mesh

    from kernel_support.trimul_common import Float16RangeError
    from pallas_kernels.trimul import trimul, trimul_sharded
    from ports import to_framework
    from ports import trimul as spec

    case = dict(seqlen=30, bs=2, dim=32, hiddendim=32, seed=17, nomask=False, distribution="normal")
    data = to_framework("jax", spec.make_inputs(case, case["seed"], "cpu"))
    whole = np.asarray(trimul(data))
    failures = []
    for devices in (1, 2, 4):
        out = trimul_sharded(data, Mesh(np.array(jax.devices()[:devices]), ("rows",)), "rows")
        if not (np.asarray(out) == whole).all():
            failures.append(f"{devices} devices differ from trimul")
    # N = 48: 16-row tiles, so 2 devices' 24 rows take two tiles each, the second padded
    taller = to_framework("jax", spec.make_inputs({**case, "seqlen": 48}, case["seed"], "cpu"))
    out = trimul_sharded(taller, Mesh(np.array(jax.devices()[:2]), ("rows",)), "rows")
    if not (np.asarray(out) == np.asarray(trimul(taller))).all():
        failures.append("N = 48 on 2 devices differs from trimul")
    try:
        trimul_sharded(data, Mesh(np.array(jax.devices()[:3]), ("rows",)), "rows")
        failures.append("3 devices were not refused")
    except ValueError as refusal:
        if "does not split over 3 devices" not in str(refusal):
            failures.append(f"3 devices: {refusal}")
    x, mask, weights, config = data
    try:
        trimul_sharded((x * 1e20, mask, weights, config), Mesh(np.array(jax.devices()[:4]), ("rows",)), "rows")
        failures.append("x * 1e20 was not refused")
    except Float16RangeError:
        pass
    sys.exit("; ".join(failures) or 0)


def in_a_process_with_four_cpu_devices(main: str):
    """`tests.test_tensor_parallel.<main>()` run in a fresh Python with JAX on 4 CPU devices; its exit status and
    output."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", "from compare import gpu_or_interpreters; gpu_or_interpreters(); "
                           f"from tests.test_tensor_parallel import {main}; {main}()"],
                          env=env, cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True, text=True)


@pytest.mark.skipif(DEVICE == "cuda", reason="devices as the CPU's, through the interpreters: one GPU holds one rank")
def test_jax_trimul_sharded_by_rows_has_one_devices_bits():
    done = in_a_process_with_four_cpu_devices("jax_trimul_main")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


@pytest.mark.skipif(DEVICE == "cuda", reason="ranks as CPU processes through the interpreters: one GPU holds one rank")
def test_the_driver_across_devices_checks_the_bits_of_both_sharding_ports(tmp_path):
    out = tmp_path / "across.json"
    done = subprocess.run([sys.executable, "-m", "compare", "trimul", "--gpus", "2", "--cases", "smoke:0", "--iters",
                           "1", "--json", str(out)], cwd=pathlib.Path(__file__).resolve().parents[1],
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(row["impl"], row["bitwise_equal"], row["check"]) for row in rows] == [("triton", True, True),
                                                                                   ("pallas", True, True)]
    assert "interpreted: no speed" in done.stdout


def test_the_driver_across_devices_fails_a_port_whose_shards_differ(monkeypatch, capsys):
    # on one JAX device (the test's process has one): a planted trimul_sharded whose every output is one ulp off
    import numpy as np

    import pallas_kernels.trimul as pallas_trimul
    from compare import across_devices
    from ports import trimul as spec

    honest = pallas_trimul.trimul_sharded
    monkeypatch.setattr(pallas_trimul, "trimul_sharded", lambda *args: np.nextafter(
        np.asarray(honest(*args)), np.inf))
    assert across_devices.run(["pallas"], [("smoke", spec.SMOKE_CASES[0])], 1, 1, DEVICE == "cuda") == 1
    assert "DIFFER" in capsys.readouterr().out


def test_the_driver_across_devices_skips_a_case_the_port_refuses(monkeypatch, capsys):
    # x beyond the float16 intermediates' range: refused on one device and on the mesh alike, a row that says so
    from compare import across_devices
    from ports import trimul as spec

    honest = spec.make_inputs

    def beyond_float16(*args):
        x, *rest = honest(*args)
        return (x * 1e20, *rest)

    monkeypatch.setattr(spec, "make_inputs", beyond_float16)
    assert across_devices.run(["pallas"], [("smoke", spec.SMOKE_CASES[0])], 1, 1, DEVICE == "cuda") == 1
    captured = capsys.readouterr()
    assert "skipped: " in captured.out and "overflows its float16 intermediates" in captured.out
    assert "no case ran on 1 devices: nothing was compared" in captured.err
    # the range check must refuse an input on N devices where it does on one: a port that refuses alone fails
    import pallas_kernels.trimul as pallas_trimul
    from kernel_support.trimul_common import Float16RangeError

    monkeypatch.setattr(spec, "make_inputs", honest)

    def refusing(data):
        raise Float16RangeError("planted refusal")

    monkeypatch.setattr(pallas_trimul, "trimul", refusing)
    assert across_devices.run(["pallas"], [("smoke", spec.SMOKE_CASES[0])], 1, 1, DEVICE == "cuda") == 1
    assert "FAILED: the range check refused it on one device only: planted refusal" in capsys.readouterr().out


def test_the_driver_across_devices_names_what_it_cannot_run(capsys):
    from compare.__main__ import main

    assert main(["trimul", "--gpus", "2", "--impl", "gluon"]) == 2
    assert "gluon cannot shard; ports that do: triton" in capsys.readouterr().err
    assert main(["matmul", "--gpus", "2"]) == 2
    assert "--gpus N takes trimul" in capsys.readouterr().err


@pytest.mark.skipif(DEVICE == "cuda", reason="ranks as CPU processes through the interpreters: one GPU holds one rank")
@pytest.mark.slow  # the command's end to end; the MLP tests above check its bits at 1, 2 and 4 ranks on every CPU run
def test_the_invariance_command_checks_the_tensor_parallel_mlp_across_devices(tmp_path):
    out = tmp_path / "tensor-parallel.json"
    done = subprocess.run([sys.executable, "-m", "compare", "invariance", "--gpus", "2", "--batches", "1,3",
                           "--repeats", "1", "--json", str(out)], cwd=pathlib.Path(__file__).resolve().parents[1],
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(row["framework"], row["same_bits_as_one_device"], row["same_bits_in_any_batch"]) for row in rows] == [
        ("torch", True, True), ("jax", True, True)]


def test_the_tensor_parallel_check_fails_a_linear_whose_rows_depend_on_the_batch(monkeypatch):
    # one process, one device: a planted MLP whose output moves by an ulp with the batch size
    from compare.invariance import tensor_parallel

    honest = tensor_parallel.torch_mlp

    def planted(x, weights, group):  # on the output's device (a CPU scalar beside a GPU tensor is refused)
        out = honest(x, weights, group)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if x.shape[0] > 1 else out

    monkeypatch.setattr(tensor_parallel, "torch_mlp", planted)
    rows, held = tensor_parallel.run(1, [1, 2], ["torch"], 1, DEVICE == "cuda")
    assert not held and rows[0]["same_bits_as_one_device"] and not rows[0]["same_bits_in_any_batch"]


def test_the_invariance_command_names_a_device_count_it_cannot_split_over(capsys):
    from compare.invariance.command import main

    assert main(["--gpus", "3"]) == 2
    assert "1, 2, 4 or 8 devices" in capsys.readouterr().err
