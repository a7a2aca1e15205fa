"""Without a CUDA GPU the kernels run through the Triton interpreter; it must be chosen before
anything imports triton. Torch and JAX share a GPU when there is one."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
