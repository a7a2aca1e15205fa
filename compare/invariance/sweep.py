"""Every reduction-bearing op a transformer runs, with each framework's batch-invariant mode on: each is
`invariant` (every sequence's bits the same alone and in every batch) or `refused` by name (the mode's NotCovered),
never silently variant. Part of `python -m compare invariance --sweep`.

The ops: softmax, log_softmax, logsumexp, standardize, the mean (over a row, and over a sequence's tokens), the
variance, the sum, the 2-norm, LayerNorm and RMSNorm, einsum and dot_general in each operand order (the rhs as it
lies or transposed, the lhs transposed, a batched product), the running sum; in torch also cross-entropy,
normalize, cosine similarity and group norm. Each runs on activations [B, TOKENS, length] in each dtype, at row
lengths that no test uses (odd, past a kernel's chunk, a vocabulary), for each B. The first and the last sequence
of each batch are compared with the same sequence run alone; `variant at B=...` names the first B that differs. The
mode off is run too (unless `--modes on`), to show which library kernels the sizes catch out.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

GPU_BATCHES = (1, 2, 3, 5, 8, 13, 31, 64, 97, 128, 251, 256)
CPU_BATCHES = (1, 2, 3)
GPU_LENGTHS = (4097, 50257)  # odd, past the row kernels' 1024-element chunk; GPT-2's vocabulary
CPU_LENGTHS = (1025,)
DTYPES = ("bfloat16", "float16", "float32")
TOKENS = 2  # a sequence's tokens: rows of its own in every op
COLUMNS = 96  # the products' N


def _inputs(length: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Float32 activations x and y [batch, TOKENS, length], a weight [length, COLUMNS] and its transpose, and
    cross-entropy's targets [batch, TOKENS]."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((length, COLUMNS)) / np.sqrt(length)).astype(np.float32)
    return {"x": 2 * rng.standard_normal((batch, TOKENS, length), np.float32),
            "y": rng.standard_normal((batch, TOKENS, length), np.float32),
            "weight": weight, "weight_t": np.ascontiguousarray(weight.T),
            "target": rng.integers(0, length, (batch, TOKENS))}


def torch_ops() -> dict:
    """name -> function of (x, y, weight, weight_t, target), each sliced to the batch, in torch."""
    import torch
    import torch.nn.functional as F

    def standardize(x, *_):
        return (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)

    return {
        "softmax": lambda x, *_: torch.softmax(x, -1),
        "log_softmax": lambda x, *_: torch.log_softmax(x, -1),
        "logsumexp": lambda x, *_: torch.logsumexp(x, -1),
        "standardize": standardize,
        "mean": lambda x, *_: x.mean(-1),
        "mean over tokens": lambda x, *_: x.mean(1),
        "var": lambda x, *_: x.var(-1),
        "sum": lambda x, *_: x.sum(-1),
        "2-norm": lambda x, *_: torch.linalg.vector_norm(x, dim=-1),
        "layer_norm": lambda x, *_: F.layer_norm(x, x.shape[-1:]),
        "rms_norm": lambda x, *_: F.rms_norm(x, x.shape[-1:]),
        "einsum btd,dn": lambda x, y, w, wt, t: torch.einsum("btd,dn->btn", x, w),
        "einsum btd,nd (rhs transposed)": lambda x, y, w, wt, t: torch.einsum("btd,nd->btn", x, wt),
        "einsum bdt,dn (lhs transposed)": lambda x, y, w, wt, t: torch.einsum("bdt,dn->btn", x.transpose(1, 2), w),
        "einsum btd,bsd (batched)": lambda x, y, *_: torch.einsum("btd,bsd->bts", x, y),
        "cumsum": lambda x, *_: torch.cumsum(x, -1),
        "cross_entropy": lambda x, y, w, wt, t: F.cross_entropy(x.flatten(0, 1), t.flatten(), reduction="none"),
        "normalize": lambda x, *_: F.normalize(x, dim=-1),
        "cosine_similarity": lambda x, y, *_: F.cosine_similarity(x, y, dim=-1),
        "group_norm": lambda x, *_: F.group_norm(x, TOKENS),
    }


def jax_ops() -> dict:
    """The same ops in JAX, each a function of (x, y, weight, weight_t, target)."""
    import jax
    import jax.numpy as jnp

    def layer_norm(x, *_):
        centred = x - jnp.mean(x, -1, keepdims=True)
        return centred * jax.lax.rsqrt(jnp.mean(jnp.square(centred), -1, keepdims=True) + 1e-5)

    def rms_norm(x, *_):
        return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + 1e-5)

    def dot_general(lhs_contracting: int, rhs_contracting: int):
        def product(x, y, w, wt, t):
            lhs = x if lhs_contracting == 2 else jnp.swapaxes(x, 1, 2)
            rhs = w if rhs_contracting == 0 else wt
            return jax.lax.dot_general(lhs, rhs, (((lhs_contracting,), (rhs_contracting,)), ((), ())))
        return product

    return {
        "softmax": lambda x, *_: jax.nn.softmax(x, -1),
        "log_softmax": lambda x, *_: jax.nn.log_softmax(x, -1),
        "logsumexp": lambda x, *_: jax.nn.logsumexp(x, -1),
        "standardize": lambda x, *_: jax.nn.standardize(x, -1),
        "mean": lambda x, *_: jnp.mean(x, -1),
        "mean over tokens": lambda x, *_: jnp.mean(x, 1),
        "var": lambda x, *_: jnp.var(x, -1),
        "sum": lambda x, *_: jnp.sum(x, -1),
        "2-norm": lambda x, *_: jnp.linalg.norm(x, axis=-1),
        "layer_norm": layer_norm,
        "rms_norm": rms_norm,
        "einsum btd,dn": lambda x, y, w, wt, t: jnp.einsum("btd,dn->btn", x, w),
        "einsum btd,nd (rhs transposed)": lambda x, y, w, wt, t: jnp.einsum("btd,nd->btn", x, wt),
        "einsum bdt,dn (lhs transposed)": lambda x, y, w, wt, t: jnp.einsum("bdt,dn->btn", jnp.swapaxes(x, 1, 2), w),
        "einsum btd,bsd (batched)": lambda x, y, *_: jnp.einsum("btd,bsd->bts", x, y),
        "dot_general (2),(0)": dot_general(2, 0),
        "dot_general (2),(1)": dot_general(2, 1),
        "dot_general (1),(0)": dot_general(1, 0),
        "cumsum": lambda x, *_: jnp.cumsum(x, -1),
    }


def verdict(outputs, batches, last: bool = True) -> str:
    """`outputs(batch)` -> a NumPy array of the batch's per-sequence results; the first sequence of each batch, and
    the last unless `last` is off, against the same sequence alone (`outputs` of that one sequence is asked as batch
    -index - 1)."""
    from batch_invariant import NotCovered

    try:
        alone = {}
        for batch in batches:
            results = outputs(batch)
            for index in {0, batch - 1} if last else {0}:
                if index not in alone:
                    alone[index] = outputs(-index - 1)[0]
                if not np.array_equal(results[index], alone[index], equal_nan=True):
                    return f"variant at B={batch}"
    except NotCovered as error:
        return f"refused: {error}"
    except Exception as error:  # noqa: BLE001 - a kernel's failure is a finding, kept with its message
        return f"failed: {type(error).__name__}: {error}"
    return "invariant"


def _torch_outputs(op, arrays: dict, dtype_name: str, device: str, invariant: bool):
    import torch

    import batch_invariant.torch_mode as bi

    dtype = getattr(torch, dtype_name)
    tensors = {name: torch.from_numpy(value).to(device, dtype if value.dtype == np.float32 else None)
               for name, value in arrays.items()}

    def outputs(batch):
        rows = slice(0, batch) if batch > 0 else slice(-batch - 1, -batch)  # -i - 1: sequence i alone
        operands = [tensors[name][rows] for name in ("x", "y")] + [tensors["weight"], tensors["weight_t"],
                                                                    tensors["target"][rows]]
        with bi.batch_invariant() if invariant else contextlib.nullcontext(), torch.no_grad():
            result = op(*operands)
        return result.float().reshape(rows.stop - rows.start, -1).cpu().numpy()

    return outputs


def _jax_outputs(op, arrays: dict, dtype_name: str, invariant: bool):
    import jax
    import jax.numpy as jnp

    from batch_invariant.jax_mode import batch_invariant

    dtype = getattr(jnp, dtype_name)
    values = {name: jnp.asarray(value, dtype if value.dtype == np.float32 else None) for name, value in arrays.items()}
    function = jax.jit(batch_invariant(op) if invariant else op)

    def outputs(batch):
        rows = slice(0, batch) if batch > 0 else slice(-batch - 1, -batch)
        result = function(values["x"][rows], values["y"][rows], values["weight"], values["weight_t"],
                          values["target"][rows])
        return np.asarray(result.astype(jnp.float32)).reshape(rows.stop - rows.start, -1)

    return outputs


def sweep(frameworks: list[str], on_gpu: bool, batches=None, lengths=None, dtypes=DTYPES, seed: int = 0,
          progress=print, ops: list[str] | None = None, keep=None, modes=("on", "off")) -> dict:
    """{framework: {op: {dtype: {length: {"on": verdict, "off": verdict}}}}} with the sizes swept and the time;
    `keep(record so far)` after each verdict, so that an interrupted sweep keeps what it found."""
    batches = list(batches or (GPU_BATCHES if on_gpu else CPU_BATCHES))
    lengths = list(lengths or (GPU_LENGTHS if on_gpu else CPU_LENGTHS))
    device = "cuda" if on_gpu else "cpu"
    started = time.perf_counter()
    verdicts = {}
    record = {"batches": batches, "lengths": lengths, "dtypes": list(dtypes), "tokens": TOKENS, "modes": list(modes),
              "verdicts": verdicts}
    for length in lengths:
        arrays = _inputs(length, max(batches), seed)
        for framework in frameworks:
            catalog = torch_ops() if framework == "torch" else jax_ops()
            for name, op in catalog.items():
                if ops and name not in ops:
                    continue
                for dtype in dtypes:
                    progress(f"sweep: {framework} {name} {dtype} length {length} ...")
                    entry = verdicts.setdefault(framework, {}).setdefault(name, {}).setdefault(dtype, {})
                    entry[str(length)] = {
                        mode: verdict(_torch_outputs(op, arrays, dtype, device, mode == "on") if framework == "torch"
                                      else _jax_outputs(op, arrays, dtype, mode == "on"), batches)
                        for mode in modes}
                    record["seconds"] = round(time.perf_counter() - started, 1)
                    if keep:
                        keep(record)
    return record


def holes(record: dict) -> list[str]:
    """Each (framework, op, dtype, length) that the mode leaves variant or that failed with the mode on."""
    return [f"{framework} {op} {dtype} length {length}: {modes['on']}"
            for framework, entries in record["verdicts"].items() for op, by_dtype in entries.items()
            for dtype, by_length in by_dtype.items() for length, modes in by_length.items()
            if modes["on"].split(":")[0].split(" at ")[0] in ("variant", "failed")]


def table(record: dict) -> list[str]:
    """Lines: each op's verdict with the mode on and off, a column a framework and dtype (the worst length's)."""
    columns = [(framework, dtype) for framework in record["verdicts"] for dtype in record["dtypes"]]
    names = list(dict.fromkeys(name for entries in record["verdicts"].values() for name in entries))
    lines = [f"the sweep, the mode on (off): a sequence alone against in a batch of {record['batches']}, rows of "
             f"{record['lengths']} ({record['seconds']} s):",
             (f"  {'op':31} " + " ".join(f"{f'{framework} {dtype}':24}" for framework, dtype in columns)).rstrip()]

    def cell(by_length: dict | None) -> str:
        if not by_length:
            return "-"
        words = {mode: [verdict.split(":")[0] for verdict in (entry.get(mode, "not run") for entry in
                                                              by_length.values())] for mode in ("on", "off")}
        worst = {mode: next((word for word in found if not word.startswith(("invariant", "refused"))),
                            next((word for word in found if word != "invariant"), "invariant"))
                 for mode, found in words.items()}
        return f"{worst['on'].replace('variant at ', 'VARIANT ')} ({worst['off'].replace('variant at ', '')})"

    for name in names:
        cells = [cell(record["verdicts"][framework].get(name, {}).get(dtype)) for framework, dtype in columns]
        lines.append((f"  {name:31} " + " ".join(f"{text:24}" for text in cells)).rstrip())
    return lines
