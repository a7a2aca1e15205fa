"""The comparison driver (`python -m compare`) and its one-case tools."""
import os


def gpu_or_interpreters() -> bool:
    """Whether a CUDA GPU is here; without one, the Triton interpreter is chosen (before anything imports triton),
    made fit for the ports (`triton_kernels.interpreter`: pairwise reductions, no warnings from masked lanes)."""
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from triton_kernels.interpreter import prepare_interpreter

        prepare_interpreter()
    return on_gpu
