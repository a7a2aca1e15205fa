"""The batch-invariant modes: the same bits for a row whatever the batch it runs in, in torch models
(`batch_invariant.torch_mode`) and JAX functions (`batch_invariant.jax_mode`), on the project's matmul ports and row
kernels. docs/batch_invariant.md says what they cover and what they refuse."""


class NotCovered(RuntimeError):
    """An op a mode does not cover. A RuntimeError, not a TypeError: torch turns a TypeError raised under `@` into
    Python's own "unsupported operand" error, which would hide the reason."""
