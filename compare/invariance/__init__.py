"""`python -m compare invariance`: the batch-invariant modes checked where they are used.

`command` (the command line and its help), `decoder` (a small decoder in torch and JAX: each sequence's bits in a
batch against alone, and across the frameworks), `ops` (each op a decoder runs, alone), `sweep` (every
reduction-bearing op at sizes no test uses), `model` and `llama_jax` (Hugging Face's Llama and Qwen2, and their JAX
twin), `tensor_parallel` (a tensor-parallel MLP on N devices against one)."""
