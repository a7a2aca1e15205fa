"""Tensor parallelism with the torch mode's bits: linears whose weights are split across the ranks of a
torch.distributed group, with the same bits on 1, 2, 4 and 8 ranks (tested on 1, 2 and 4), and for a row in any batch.

A tensor-parallel model splits each linear's weight across ranks (Megatron's column- and row-parallel pair):
- **column-parallel**: a rank holds some output features (rows of the weight) and computes them in full. Each output
  element's sum over K is the ports' sum whatever the width N (their tilings walk K in the same 16-deep steps:
  `kernel_support.matmul_common`), so the gathered output has the bits of one rank's linear under the mode: its
  `addmm`, which `F.linear` runs for 2-d or contiguous input (a non-contiguous input with a bias goes through a
  product rounded to x's dtype, then the bias added and rounded again).
- **row-parallel**: a rank holds some input features (columns of the weight) and the matching slice of the input,
  and the ranks' partial products must be summed. An all-reduce sums them in an order that NCCL picks by message
  size and rank count, which moves bits. Here K is cut into 8 pieces (`TENSOR_PARALLEL_PARTS`) whatever the rank
  count: each piece's product in float32 on the port, the pieces gathered to every rank and added in piece order,
  element by element, then the bias, rounded once. One rank computes the same pieces and the same sum, so 1, 2, 4
  and 8 ranks give the same bits; the pieces are the mode's products and the sum is elementwise, so a row's bits do
  not depend on the batch. The price: the gather moves 8 float32 partial products where an all-reduce moves one.

The row-parallel sum is the one bitwise definition of a linear over 8 pieces, not the mode's one-piece linear:
its bits differ from `F.linear`'s under the mode, and agree with each other across rank counts. Inference only: the
gathers carry no gradient. The rest of the model (norms, attention, the elementwise ops) runs under the mode as on
one rank (`batch_invariant.torch_mode`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from batch_invariant import row_parallel_pieces, tensor_parallel_share
from batch_invariant.kernels import _check, _product


def ranks_and_rank(group) -> tuple[int, int]:
    """(ranks, this rank) of a torch.distributed group; (1, 0) for group None, one process alone."""
    if group is None:
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _gathered(local: torch.Tensor, group, dim: int) -> torch.Tensor:
    """The ranks' `local` tensors (the same shape on every rank) concatenated along `dim` in rank order."""
    ranks, _ = ranks_and_rank(group)
    if ranks == 1:
        return local
    pieces = [torch.empty_like(local) for _ in range(ranks)]
    dist.all_gather(pieces, local.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


def _inference_only(*tensors: torch.Tensor | None) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise ValueError("tensor-parallel linears are for inference: their gathers carry no gradient (run under "
                         "torch.no_grad())")


def shard(weight: torch.Tensor, bias: torch.Tensor | None, kind: str, group) -> tuple:
    """This rank's share of a full linear's weight [N, K] and bias [N]: ("column") rows of the weight and the bias,
    ("row") columns of the weight and the whole bias, which the row-parallel sum adds once."""
    ranks, rank = ranks_and_rank(group)
    share = tensor_parallel_share(weight.shape, kind, ranks)
    if kind == "column":
        rows = slice(rank * share, (rank + 1) * share)
        return weight[rows].contiguous(), None if bias is None else bias[rows].contiguous()
    return weight[:, rank * share:(rank + 1) * share].contiguous(), bias


def column_parallel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group, *,
                    gather: bool = True) -> torch.Tensor:
    """x [..., K] @ weight.T + bias for this rank's rows of the weight (`shard(..., "column", group)`), in x's dtype:
    all the output features, in rank order (gather), or this rank's alone, the input of a row-parallel linear."""
    _inference_only(x, weight, bias)
    _check("linear", x, weight, *(() if bias is None else (bias,)))
    rows = x.reshape(-1, x.shape[-1])
    total = _product(rows, weight.T, "float32")
    if bias is not None:
        total = total + bias.float()
    local = total.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])
    return _gathered(local, group, dim=-1) if gather else local


def row_parallel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group, *,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """The linear whose input features are split across ranks: x [..., K / ranks] this rank's slice of the input,
    weight [N, K / ranks] its columns (`shard(..., "row", group)`), bias [N] whole; returns the whole output
    [..., N] in `dtype` (default x's; float32 for logits kept wide), the same on every rank: K's 8 pieces as
    float32 products, added in piece order."""
    _inference_only(x, weight, bias)
    _check("linear", x, weight, *(() if bias is None else (bias,)))
    local_parts = row_parallel_pieces(x.shape[-1], ranks_and_rank(group)[0])
    rows = x.reshape(-1, x.shape[-1])
    width = rows.shape[1] // local_parts
    pieces = torch.stack([_product(rows[:, p * width:(p + 1) * width], weight[:, p * width:(p + 1) * width].T,
                                   "float32") for p in range(local_parts)])
    pieces = _gathered(pieces, group, dim=0)  # [8, M, N], in piece order
    total = pieces[0]
    for piece in pieces[1:]:
        total = total + piece
    if bias is not None:
        total = total + bias.float()
    return total.to(dtype or x.dtype).reshape(*x.shape[:-1], weight.shape[0])
