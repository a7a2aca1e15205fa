"""The batch-invariant modes: the same bits for a row whatever the batch it runs in, in torch models
(`batch_invariant.torch_mode`) and JAX functions (`batch_invariant.jax_mode`), on the project's matmul ports and row
kernels. docs/batch_invariant.md says what they cover and what they refuse."""


class NotCovered(RuntimeError):
    """An op a mode does not cover. A RuntimeError, not a TypeError: torch turns a TypeError raised under `@` into
    Python's own "unsupported operand" error, which would hide the reason."""


TENSOR_PARALLEL_PARTS = 8  # the pieces of a row-parallel linear's K, whatever the ranks (1, 2, 4 or 8 divide them):
# `torch_tensor_parallel`, `jax_tensor_parallel`


def tensor_parallel_share(weight_shape, kind: str, ranks: int) -> int:
    """How many of a linear's features (weight [N, K]) a rank holds, split `kind` over `ranks`: "column", N's rows;
    "row", K's columns. ValueError where they do not split."""
    if kind not in ("column", "row"):
        raise ValueError(f"kind must be 'column' or 'row', got {kind!r}")
    size = weight_shape[0] if kind == "column" else weight_shape[1]
    if size % ranks:
        raise ValueError(f"a {kind}-parallel weight of {size} {'rows' if kind == 'column' else 'columns'} does not "
                         f"split over {ranks} ranks")
    return size // ranks


def row_parallel_pieces(features: int, ranks: int) -> int:
    """The pieces of K that a rank's `features` input features of a row-parallel linear make: TENSOR_PARALLEL_PARTS
    shared by the ranks. ValueError where they do not divide."""
    if TENSOR_PARALLEL_PARTS % ranks:
        raise ValueError(f"a row-parallel linear runs on 1, 2, 4 or 8 ranks (dividing its {TENSOR_PARALLEL_PARTS} "
                         f"pieces), not {ranks}")
    pieces = TENSOR_PARALLEL_PARTS // ranks
    if features % pieces:
        raise ValueError(f"a row-parallel linear needs K divisible by {TENSOR_PARALLEL_PARTS}: a rank's {features} "
                         f"input features do not split into {pieces} pieces")
    return pieces
