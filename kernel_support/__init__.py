"""What the kernel packages share per workload and per framework: tilings and the heuristics that pick them, eigh's
constants, padding, scratch buffers, the launch helpers (Triton's and Gluon's from torch, Pallas's from JAX) and where
the JAX ports' kernels run (`jax_backend`). The kernel packages import it; the interface (ports) does not need it."""
