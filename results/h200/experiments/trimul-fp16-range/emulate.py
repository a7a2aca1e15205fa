"""TriMul's fp16 intermediates against inputs of larger range: the ports' arithmetic emulated in torch on a CPU.

    python results/h200/experiments/trimul-fp16-range/emulate.py

The ports store LayerNorm(x), the gated left and right projections, the triangle product and the gated output
norm in 16 bits, and multiply 16-bit operands with float32 accumulation (tensor cores). This rounds each at the
same points (float32 arithmetic in between) and checks the result against the float64 reference with TriMul's
check, for the weights of GPU MODE's distribution scaled by 1, 10 and 100, in three storage schemes:
- fp16: what the ports do now;
- bf16: the gated projections and the product in bfloat16 (fp32's range, three fewer mantissa bits);
- fp16 scaled: the left and right projection weights scaled by a power of two chosen from this input's own
  largest |left|, |right| and |product| (an oracle: a port would have to find it on the device), the output
  LayerNorm's eps scaled by its fourth power, so that the function is unchanged.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from ports import trimul as spec  # noqa: E402

EPS = spec.LAYER_NORM_EPS


def dot(a, b, store):
    """a @ b.T with operands rounded to the 16-bit type, float32 accumulation."""
    return store(a).float() @ store(b).float().T


def emulate(data, scheme: str):
    x, mask, w, config = data
    fp16 = lambda t: t.to(torch.float16)  # noqa: E731
    wide = (lambda t: t.to(torch.bfloat16)) if scheme == "bf16" else fp16
    normed = fp16(F.layer_norm(x, (x.shape[-1],), w["norm.weight"], w["norm.bias"], EPS)).float()
    m = mask.float().unsqueeze(-1)
    scale = 1.0
    if scheme == "fp16 scaled":  # the oracle's power of two for left and right, each
        left = (normed @ w["left_proj.weight"].T) * torch.sigmoid(normed @ w["left_gate.weight"].T) * m
        right = (normed @ w["right_proj.weight"].T) * torch.sigmoid(normed @ w["right_gate.weight"].T) * m
        product = torch.einsum("bikh,bjkh->bijh", left.double(), right.double())
        need = max(float(left.abs().max()) / 2**12, float(right.abs().max()) / 2**12,
                   math.sqrt(float(product.abs().max()) / 2**14), 1.0)
        scale = 2.0 ** -math.ceil(math.log2(need))
    left = wide(dot(normed, w["left_proj.weight"] * scale, fp16) * torch.sigmoid(dot(normed, w["left_gate.weight"], fp16))
                * m).float()
    right = wide(dot(normed, w["right_proj.weight"] * scale, fp16)
                 * torch.sigmoid(dot(normed, w["right_gate.weight"], fp16)) * m).float()
    if scheme == "bf16":
        product = torch.einsum("bikh,bjkh->bijh", left, right)  # bf16 operands are exact in float32
    else:
        product = torch.einsum("bikh,bjkh->bijh", left.half().float(), right.half().float())
    product = wide(product).float()
    out = F.layer_norm(product, (product.shape[-1],), w["to_out_norm.weight"], w["to_out_norm.bias"],
                       EPS * scale**4)
    out = fp16(out * torch.sigmoid(dot(normed, w["out_gate.weight"], fp16))).float()
    return dot(out, w["to_out.weight"], fp16)


def main() -> int:
    torch.manual_seed(0)
    cases = [spec._case(64, 1, 128, 11, False, "normal"), spec._case(128, 1, 128, 12, True, "cauchy"),
             spec._case(256, 1, 128, 13, True, "normal")]
    print(f"{'case':34} {'weights':>7}  " + "  ".join(f"{s:>28}" for s in ("fp16", "bf16", "fp16 scaled")))
    for case in cases:
        data = spec.make_inputs(case, case["seed"])
        for factor in (1, 10, 100):
            x, mask, w, config = data
            scaled = (x, mask, {k: v * factor for k, v in w.items()}, config)
            expected = spec.reference(scaled)
            cells = []
            for scheme in ("fp16", "bf16", "fp16 scaled"):
                verdict = spec.check(scaled, emulate(scaled, scheme), expected)
                cells.append(("pass" if verdict.passed else "FAIL") + f" rel_fro {verdict.errors.get('rel_fro', float('nan')):.1e}"
                             f" bad {verdict.errors.get('mismatched', '-')}")
            print(f"{spec.case_name(case):34} {factor:>7}  " + "  ".join(f"{c:>28}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
