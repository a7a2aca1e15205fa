"""The small transformer decoder of `python -m compare invariance` (compare.invariance.command), in torch and in
JAX with the same weights, and its checks: each sequence's logits and input gradient in a batch against alone, the
two frameworks against each other, and the cost of the mode."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

EPS = 1e-5


@dataclass(frozen=True)
class Decoder:
    vocab: int = 64
    dim: int = 32
    heads: int = 2
    hidden: int = 64
    layers: int = 2
    length: int = 8  # tokens a sequence

    def weights(self, seed: int) -> dict[str, np.ndarray]:
        """Float32 weights, scaled so that activations stay near unit size."""
        rng = np.random.default_rng(seed)

        def normal(*shape, fan_in):
            return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)

        weights = {"embed": normal(self.vocab, self.dim, fan_in=1), "norm": 1 + 0.1 * normal(self.dim, fan_in=1),
                   "lm_head": normal(self.dim, self.vocab, fan_in=self.dim)}
        for i in range(self.layers):
            weights.update({f"norm1.{i}": 1 + 0.1 * normal(self.dim, fan_in=1),
                            f"wqkv.{i}": normal(self.dim, 3 * self.dim, fan_in=self.dim),
                            f"wo.{i}": normal(self.dim, self.dim, fan_in=self.dim),
                            f"norm2.{i}": 1 + 0.1 * normal(self.dim, fan_in=1),
                            f"wgu.{i}": normal(self.dim, 2 * self.hidden, fan_in=self.dim),
                            f"wdown.{i}": normal(self.hidden, self.dim, fan_in=self.hidden)})
        return weights

    def tokens(self, batch: int, seed: int) -> np.ndarray:
        return np.random.default_rng(seed + 1).integers(0, self.vocab, (batch, self.length + 1))


def decoder_torch(model: Decoder, weights: dict, inputs, trace: dict | None = None):
    """Logits [B, T, vocab] from embedded inputs [B, T, dim] (torch); `trace` collects the intermediates."""
    import torch

    def keep(name, value):
        if trace is not None:
            trace[name] = value
        return value

    def rms_norm(x, weight):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)

    batch, length, dim = inputs.shape
    head_dim = dim // model.heads
    x = inputs
    for i in range(model.layers):
        h = keep(f"norm1.{i}", rms_norm(x, weights[f"norm1.{i}"]))
        qkv = keep(f"qkv.{i}", h @ weights[f"wqkv.{i}"])
        q, k, v = (part.reshape(batch, length, model.heads, head_dim).transpose(1, 2) for part in qkv.split(dim, -1))
        attention = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        attention = keep(f"attention.{i}", attention.transpose(1, 2).reshape(batch, length, dim))
        x = keep(f"residual1.{i}", x + attention @ weights[f"wo.{i}"])
        h = keep(f"norm2.{i}", rms_norm(x, weights[f"norm2.{i}"]))
        gate, up = (h @ weights[f"wgu.{i}"]).split(model.hidden, -1)
        gated = keep(f"silu.{i}", (torch.nn.functional.silu(gate.float()) * up.float()).to(x.dtype))
        x = keep(f"residual2.{i}", x + gated @ weights[f"wdown.{i}"])
    return keep("logits", rms_norm(x, weights["norm"]) @ weights["lm_head"])


def decoder_jax(model: Decoder, weights: dict, inputs, trace: dict | None = None):
    """The same decoder in JAX."""
    import jax
    import jax.numpy as jnp

    def keep(name, value):
        if trace is not None:
            trace[name] = value
        return value

    def rms_norm(x, weight):
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + EPS)
                * weight.astype(jnp.float32)).astype(x.dtype)

    batch, length, dim = inputs.shape
    head_dim = dim // model.heads
    causal = jnp.triu(jnp.full((length, length), -jnp.inf, jnp.float32), 1)
    x = inputs
    for i in range(model.layers):
        h = keep(f"norm1.{i}", rms_norm(x, weights[f"norm1.{i}"]))
        qkv = keep(f"qkv.{i}", h @ weights[f"wqkv.{i}"])
        q, k, v = (part.reshape(batch, length, model.heads, head_dim).transpose(0, 2, 1, 3)
                   for part in jnp.split(qkv, 3, axis=-1))
        # attention as its definition, as the torch mode runs scaled_dot_product_attention: the scores in float32,
        # scaled and masked in float32
        scores = keep(f"scores.{i}", jnp.matmul(q, k.transpose(0, 1, 3, 2), preferred_element_type=jnp.float32)
                      * head_dim**-0.5)
        probs = keep(f"softmax.{i}", jax.nn.softmax(scores + causal, axis=-1).astype(x.dtype))
        attention = keep(f"attention.{i}", (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, dim))
        x = keep(f"residual1.{i}", x + attention @ weights[f"wo.{i}"])
        h = keep(f"norm2.{i}", rms_norm(x, weights[f"norm2.{i}"]))
        gate, up = jnp.split(h @ weights[f"wgu.{i}"], 2, axis=-1)
        gated = keep(f"silu.{i}", (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(x.dtype))
        x = keep(f"residual2.{i}", x + gated @ weights[f"wdown.{i}"])
    return keep("logits", rms_norm(x, weights["norm"]) @ weights["lm_head"])


class TorchRunner:
    """The decoder in torch on this machine's device, its mode on or off."""

    name = "torch"

    def __init__(self, model: Decoder, weights: dict, on_gpu: bool):
        import torch

        self.torch, self.model = torch, model
        self.device = "cuda" if on_gpu else "cpu"
        self.dtype = torch.bfloat16 if on_gpu else torch.float16
        self.weights = {name: torch.from_numpy(value).to(self.device, self.dtype) for name, value in weights.items()}

    def _mode(self, invariant: bool):
        import contextlib

        import batch_invariant.torch_mode as bi

        return bi.batch_invariant() if invariant else contextlib.nullcontext()

    held = _mode  # a serving loop enters the mode once: calls inside it only count the nesting

    def switch(self) -> None:
        """Enter and leave the mode (torch.library registers and drops its kernels)."""
        with self._mode(True):
            pass

    def _logits(self, tokens: np.ndarray, invariant: bool):
        inputs = self.weights["embed"][self.torch.from_numpy(tokens[:, :-1]).to(self.device)]
        with self._mode(invariant), self.torch.no_grad():
            return decoder_torch(self.model, self.weights, inputs)

    def logits(self, tokens: np.ndarray, invariant: bool) -> np.ndarray:
        return self._logits(tokens, invariant).float().cpu().numpy()

    def forward(self, tokens: np.ndarray, invariant: bool) -> None:
        """A forward pass to the logits on the device, waited for (not copied to the host: the cost compares the
        passes, not a copy that both pay alike)."""
        self._logits(tokens, invariant)
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def input_gradients(self, tokens: np.ndarray, invariant: bool) -> np.ndarray:
        torch = self.torch
        inputs = self.weights["embed"][torch.from_numpy(tokens[:, :-1]).to(self.device)].detach().requires_grad_()
        targets = torch.from_numpy(tokens[:, 1:]).to(self.device)
        with self._mode(invariant):
            logits = decoder_torch(self.model, self.weights, inputs).float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, self.model.vocab), targets.reshape(-1),
                                                     reduction="sum")
            loss.backward()
        return inputs.grad.float().cpu().numpy()

    def train_step(self, tokens: np.ndarray, invariant: bool) -> float:
        """One training step's forward and backward pass (every weight's gradient), waited for: the loss."""
        torch = self.torch
        weights = {name: value.detach().requires_grad_() for name, value in self.weights.items()}
        tokens = torch.from_numpy(tokens).to(self.device)
        with self._mode(invariant):
            logits = decoder_torch(self.model, weights, weights["embed"][tokens[:, :-1]]).float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, self.model.vocab), tokens[:, 1:].reshape(-1),
                                                     reduction="sum")
            loss.backward()
        return float(loss.detach())

    def trace(self, tokens: np.ndarray, invariant: bool = True) -> dict[str, np.ndarray]:
        trace = {}
        inputs = self.weights["embed"][self.torch.from_numpy(tokens[:, :-1]).to(self.device)]
        with self._mode(invariant), self.torch.no_grad():
            decoder_torch(self.model, self.weights, inputs, trace)
        return {name: value.float().cpu().numpy() for name, value in trace.items()}


class JaxRunner:
    """The decoder in JAX, jitted, its transformation on or off."""

    name = "jax"

    def __init__(self, model: Decoder, weights: dict, on_gpu: bool):
        import jax
        import jax.numpy as jnp

        from batch_invariant.jax_mode import batch_invariant

        self.jax, self.jnp, self.model = jax, jnp, model
        self.dtype = jnp.bfloat16 if on_gpu else jnp.float16
        self.weights = {name: jnp.asarray(value, self.dtype) for name, value in weights.items()}

        def forward(weights, tokens):
            return decoder_jax(model, weights, weights["embed"][tokens[:, :-1]]).astype(jnp.float32)

        def loss(inputs, weights, tokens):
            logits = decoder_jax(model, weights, inputs).astype(jnp.float32)
            picked = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[:, 1:, None], -1)
            return -jnp.sum(picked)

        def input_gradients(weights, tokens):
            return jax.grad(loss)(weights["embed"][tokens[:, :-1]], weights, tokens).astype(jnp.float32)

        def train_step(weights, tokens):
            return jax.value_and_grad(lambda weights: loss(weights["embed"][tokens[:, :-1]], weights, tokens))(weights)

        self._logits = {False: jax.jit(forward), True: jax.jit(batch_invariant(forward))}
        self._gradients = {False: jax.jit(input_gradients), True: jax.jit(batch_invariant(input_gradients))}
        self._train_step = {False: jax.jit(train_step), True: jax.jit(batch_invariant(train_step))}
        self._batch_invariant = batch_invariant

    def held(self, invariant: bool):
        """Nothing to hold: the transformation is part of each jitted function."""
        import contextlib

        return contextlib.nullcontext()

    def logits(self, tokens: np.ndarray, invariant: bool) -> np.ndarray:
        return np.asarray(self._logits[invariant](self.weights, self.jnp.asarray(tokens)))

    def forward(self, tokens: np.ndarray, invariant: bool) -> None:
        self.jax.block_until_ready(self._logits[invariant](self.weights, self.jnp.asarray(tokens)))

    def input_gradients(self, tokens: np.ndarray, invariant: bool) -> np.ndarray:
        return np.asarray(self._gradients[invariant](self.weights, self.jnp.asarray(tokens)))

    def train_step(self, tokens: np.ndarray, invariant: bool) -> float:
        loss, gradients = self._train_step[invariant](self.weights, self.jnp.asarray(tokens))
        self.jax.block_until_ready(gradients)
        return float(loss)

    def trace(self, tokens: np.ndarray, invariant: bool = True) -> dict[str, np.ndarray]:
        def traced(weights, tokens):
            trace = {}
            decoder_jax(self.model, weights, weights["embed"][tokens[:, :-1]], trace)
            return {name: value.astype(self.jnp.float32) for name, value in trace.items()}

        outputs = (self._batch_invariant(traced) if invariant else self.jax.jit(traced))(
            self.weights, self.jnp.asarray(tokens))
        return {name: np.asarray(value) for name, value in outputs.items()}


def batch_comparisons(runner, tokens: np.ndarray, batches: list[int], invariant: bool) -> dict:
    """For each batch size B: whether every sequence's logits and input gradient in the batch of B are bit for bit
    its own alone, the first sequence that is not, and where its logits differ the first intermediate that does
    (the decoder's op that made the sequence's bits depend on the batch)."""
    alone = [(runner.logits(tokens[i:i + 1], invariant)[0], runner.input_gradients(tokens[i:i + 1], invariant)[0])
             for i in range(max(batches))]
    entries = {}
    for batch in batches:
        logits = runner.logits(tokens[:batch], invariant)
        gradients = runner.input_gradients(tokens[:batch], invariant)
        differing = {what: next((i for i in range(batch) if not np.array_equal(values[i], alone[i][n])), None)
                     for n, (what, values) in enumerate((("logits", logits), ("gradient", gradients)))}
        entries[batch] = {"logits": differing["logits"] is None, "gradient": differing["gradient"] is None,
                          "first_differing_sequence": differing["logits"] if differing["logits"] is not None
                          else differing["gradient"]}
        if differing["logits"] is not None:
            sequence = differing["logits"]
            in_batch = runner.trace(tokens[:batch], invariant)
            difference = first_difference({name: value[sequence:sequence + 1] for name, value in in_batch.items()},
                                           runner.trace(tokens[sequence:sequence + 1], invariant))
            entries[batch]["first_differing_op"] = difference and difference["op"]
    return entries


def per_batch(cost: dict) -> dict:
    """A framework's cost entries by batch size (without the mode's switch time)."""
    return {batch: entry for batch, entry in cost.items() if batch != "switch_ms"}


def costs(runner, tokens: np.ndarray, batches: list[int], repeats: int) -> dict:
    """Per batch size, the median host time of a forward pass (to the logits on the device, waited for) and of a
    training step (every weight's gradient), the mode off and on, after one untimed call of each. The mode is held
    across the timed calls, as a model that runs in it enters it once (torch: entering and leaving it, timed apart,
    is `switch_ms`)."""
    from compare.timing import median_after_warm_up

    def median_ms(call, mode):
        with runner.held(mode == "on"):
            return median_after_warm_up(call, repeats) * 1e3

    entries = {}
    if hasattr(runner, "switch"):
        entries["switch_ms"] = median_after_warm_up(runner.switch, repeats) * 1e3
    for batch in batches:
        rows = tokens[np.arange(batch) % len(tokens)]
        entries[batch] = {f"{what}_ms": {mode: median_ms(lambda: step(rows, mode == "on"), mode)
                                         for mode in ("off", "on")}
                          for what, step in (("forward", runner.forward), ("step", runner.train_step))}
    return entries


def first_difference(trace: dict, other_trace: dict) -> dict | None:
    """The first intermediate, in the decoder's order, whose values differ between two traces (torch's and JAX's, or
    a sequence's in a batch and alone): its name and the largest difference; None when every one is equal."""
    for name, value in trace.items():
        other = other_trace[name]
        if not np.array_equal(value, other):
            return {"op": name, "max_abs_diff": float(np.max(np.abs(value - other))),
                    "elements_differing": int(np.sum(value != other)), "elements": int(value.size)}
    return None


def cross_comparison(torch_runner, jax_runner, tokens: np.ndarray) -> dict:
    """torch against JAX with both modes on: whether the logits and input gradients are the same bits, and where
    they are not, the first sequence whose logits differ and the first intermediate of it that does."""
    runners = (torch_runner, jax_runner)
    logits = [runner.logits(tokens, True) for runner in runners]
    sequence = next((i for i in range(len(tokens)) if not np.array_equal(logits[0][i], logits[1][i])), None)
    gradients = [runner.input_gradients(tokens, True) for runner in runners]
    gradient_equal = np.array_equal(*gradients)
    return {"logits_equal": sequence is None, "first_differing_sequence": sequence,
            "first_difference": None if sequence is None else first_difference(
                *(runner.trace(tokens[sequence:sequence + 1]) for runner in runners)),
            "gradient_equal": gradient_equal,
            "gradient_max_abs_diff": 0.0 if gradient_equal else float(np.max(np.abs(gradients[0] - gradients[1])))}


def run(model: Decoder, batches: list[int], frameworks: list[str], seed: int = 0, progress=print,
        cost_batches: list[int] | None = None, repeats: int = 5, ops: bool = False) -> dict:
    from compare import gpu_or_interpreters
    from compare.records import device_info, provenance, versions

    on_gpu = gpu_or_interpreters()
    weights, tokens = model.weights(seed), model.tokens(max(batches), seed)
    runners = {"torch": TorchRunner, "jax": JaxRunner}
    made = provenance([])
    made.pop("sources")
    record = {"model": asdict(model), "batches": batches, **made, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
              **device_info(), "versions": versions(), "dtype": "bfloat16" if on_gpu else "float16",
              "frameworks": {}}
    built = {}
    for name in frameworks:
        built[name] = runners[name](model, weights, on_gpu)
        for invariant in (False, True):
            progress(f"{name}, mode {'on' if invariant else 'off'} ...")
            record["frameworks"].setdefault(name, {})["on" if invariant else "off"] = batch_comparisons(
                built[name], tokens, batches, invariant)
    if set(frameworks) == {"torch", "jax"}:
        progress("torch against JAX, both modes on ...")
        record["cross"] = cross_comparison(built["torch"], built["jax"], tokens)
    if cost_batches:
        record["cost"] = {}
        for name, runner in built.items():
            progress(f"{name}: timing the forward pass and a training step, the mode off and on ...")
            record["cost"][name] = costs(runner, model.tokens(max(cost_batches), seed), cost_batches, repeats)
    if ops:
        from compare.invariance.ops import probe

        record["ops"] = probe(frameworks, on_gpu, batches, seed, progress)
    record["passed"] = all(entry["logits"] and entry["gradient"] for runs in record["frameworks"].values()
                           for entry in runs["on"].values())
    return record


def cross_verdict(cross: dict) -> str:
    """torch against JAX with both modes on, in a sentence (the table's and the report's)."""
    if cross.get("logits_equal") and cross.get("gradient_equal"):
        return "torch against JAX, both modes on: the same bits, logits and input gradients."
    first = cross.get("first_difference")
    return (f"torch against JAX, both modes on: logits {'the same' if cross.get('logits_equal') else 'differ'}"
            + (f" (first in sequence {cross.get('first_differing_sequence', 0)} at `{first['op']}`: "
               f"{first['elements_differing']} of {first['elements']} elements, by up "
               f"to {first['max_abs_diff']:.3g})" if first else "")
            + "; input gradients " + ("the same" if cross.get("gradient_equal")
                                      else f"differ, by up to {cross['gradient_max_abs_diff']:.3g}") + ".")


def table(record: dict) -> str:
    lines = [f"{'framework':10} {'mode':5} " + " ".join(f"B={batch:<5}" for batch in record["batches"]),
             "(each cell: logits, input gradient; = bit for bit the same as each sequence alone, x differs)"]
    for name, runs in record["frameworks"].items():
        for mode, entries in runs.items():
            cells = " ".join(f"{'=' if e['logits'] else 'x'}{'=' if e['gradient'] else 'x'}     "
                             for e in entries.values())
            lines.append(f"{name:10} {mode:5} {cells}")
            first = next(((batch, e["first_differing_op"]) for batch, e in entries.items()
                          if e.get("first_differing_op")), None)
            if first:
                lines.append(f"{'':10} {'':5} a sequence's logits first differ at B={first[0]} in {first[1]}")
    if record.get("cross"):
        lines.append(cross_verdict(record["cross"]))
    if record.get("cost"):
        note = "" if record["mode"] == "gpu" else " (CPU interpreters: NOT GPU timings)"
        lines.append(f"cost, median host ms, mode off -> on{note}:")
        for name, entries in record["cost"].items():
            if "switch_ms" in entries:
                lines.append(f"  {name:6} entering and leaving the mode {entries['switch_ms']:.3g}")
            for batch, entry in per_batch(entries).items():
                lines.append(f"  {name:6} B={batch:<5} " + "  ".join(
                    f"{what[:-3]} {times['off']:.3g} -> {times['on']:.3g} ({times['on'] / times['off']:.2f}x)"
                    for what, times in entry.items()))
    if record.get("ops"):
        from compare.invariance.ops import table as ops_table

        lines.extend(ops_table(record["ops"]))
    lines.append("passed" if record["passed"] else "FAILED: a mode that is on let a result depend on the batch")
    return "\n".join(lines)
