"""Pallas ports on the Triton lowering (deprecated since JAX 0.11), one module per workload."""
