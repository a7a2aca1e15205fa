"""How far above the true eigenvalue error the hunt's bound sits (ports.eigh.bounded_check): torch's float32 eigh as
the output, on every family at n = 128 (8 matrices) and 512 (4), the check's eigenvalue figure (against float64
eigenvalues) beside the bound's, both in the gate's units (200 passes).

    python results/h200/experiments/eigh-reliability/bounded_check_tightness.py   (CPU, about a minute)
"""
import torch

from ports import eigh as spec

for n, batch in ((128, 8), (512, 4)):
    for family in spec.FAMILIES + tuple(spec.LAPACK_TYPES):
        a = spec.make_inputs(spec._case(batch, n, 2, 11, family), 11, "cpu")
        values, vectors = torch.linalg.eigh(a)
        full, bounded = spec.check(a, (vectors, values), spec.reference(a)), spec.bounded_check(a, (vectors, values))
        errors = full.errors
        print(f"n {n:4d} {family:36s} eigenvalues {errors['eigenvalues_scaled']:.3f}  bound "
              f"{bounded.errors['eigenvalues_bound_scaled']:.3f}  orthogonality {errors['orthogonality_scaled']:.3f}",
              flush=True)
