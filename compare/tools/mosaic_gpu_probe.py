"""What Pallas on Mosaic GPU can express of the eigh ports' stages: one small kernel per operation they rest on.

    python -m compare.tools.mosaic_gpu_probe

Each probe is a `plgpu.kernel` over one 64 x 64 float32 tile (one warpgroup), written the plain way, in both of
Mosaic GPU's lowering semantics. It is lowered for CUDA (sm_90; no GPU needed) and, where the lowering succeeds and
this jax's interpreter runs on a CPU, run in Mosaic GPU's interpreter against NumPy. A probe that does not lower is
reported with the lowering's own error: the operation is out of the language's reach as written, not necessarily
out of reach of a rewrite. Nothing here is timed.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from compare.tools.hopper_compile import lower_for_hopper
from mosaic_gpu_kernels.probes import N, READS_REFS, kernel_body, probe_kernel, probes


def lower_and_run(body, semantics, interpret_params, value):
    """(the lowering's verdict: 'lowered' or its error, then the interpreter's output or error, or None)."""
    import jax
    import jax.numpy as jnp

    try:
        text = lower_for_hopper(jax.jit(probe_kernel(body, semantics, None)),
                                jax.ShapeDtypeStruct((N, N), jnp.float32)).as_text()
    except Exception as error:  # noqa: BLE001 - the probe reports what the lowering says
        return _short(error), None
    lowered = "lowered" if "mosaic_gpu" in text else "lowered, but no Mosaic GPU call in the module"
    if interpret_params is None:
        return lowered, None
    try:
        return lowered, np.asarray(jax.jit(probe_kernel(body, semantics, interpret_params()))(jnp.asarray(value)))
    except Exception as error:  # noqa: BLE001
        return lowered, _short(error)


def _short(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:160]


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m compare.tools.mosaic_gpu_probe", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    import warnings

    import jax
    from jax.experimental.pallas import mosaic_gpu as plgpu

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    interpret_params = getattr(plgpu, "InterpretGPUParams", None)  # public from jax 0.11
    rng = np.random.default_rng(0)
    value = (rng.standard_normal((N, N)) + 4.0 * np.eye(N)).astype(np.float32)
    value[0, 0] = 5.0  # the trip count of "loop, trip count from memory"
    print(f"jax {jax.__version__}; each probe lowered for CUDA (sm_90) on {jax.default_backend()}, then "
          + ("run in Mosaic GPU's interpreter against NumPy" if interpret_params
             else "not run (this jax's interpreter is private)"))
    for name, (use, op, reference) in probes().items():
        print(f"{name}: {use}")
        for staged in ((False,) if name in READS_REFS else (False, True)):
            for semantics in (plgpu.LoweringSemantics.Warpgroup, plgpu.LoweringSemantics.Lane):
                lowered, ran = lower_and_run(kernel_body(op, staged, name in READS_REFS), semantics,
                                             interpret_params, value)
                if isinstance(ran, np.ndarray):
                    ran = "matches NumPy" if np.allclose(ran, reference(value), rtol=1e-4, atol=1e-4) else "WRONG"
                way = "through SMEM, WGMMA layout" if staged else "plain"
                print(f"  {way:27} {semantics.name:9} {lowered}" + (f"; interpreter: {ran}" if ran else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
