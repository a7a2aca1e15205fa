"""What the TriMul kernel ports share: their tiling and the heuristic that picks it, the sequence padding, scratch
buffers, the sizes the kernels take, the refusal of inputs beyond their float16 range, and (for the torch ports) the
weights cast to float16 in one launch, with the range flags that launch sets up."""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@dataclass(frozen=True)
class TriMulTiling:
    """Tile sizes shared by the Triton and Pallas ports (same kernels, same names).

    rows: pairs (b, i, k) per program in the projection kernel; output_rows: the same in the output kernel;
    norm_rows: pairs per program in the LayerNorm kernel (fewer, so its [rows, dim] block stays in registers);
    tile_dim: the chunk of dim reduced per step in the projections; tile_out: the chunk of dim written per step of
    the output projection; tile_i, tile_j, tile_k: the triangle contraction's matmul tiles. The Triton port takes
    its own output rows and warps where dim <= 128 (`triton_kernels.trimul.triton_tiling`).
    """

    rows: int
    norm_rows: int
    tile_dim: int
    tile_out: int
    tile_i: int
    tile_j: int
    tile_k: int
    output_rows: int = 128
    norm_warps: int = 4
    project_warps: int = 8
    contract_warps: int = 8
    output_warps: int = 8
    stages: int = 3


def largest_power_of_two_dividing(n: int, cap: int) -> int:
    size = cap
    while n % size:
        size //= 2
    return size


SEQUENCE_MULTIPLE = 16  # the kernels' sequence length: the ports pad N up to a multiple of it


def padded_length(seq: int, multiple: int = SEQUENCE_MULTIPLE) -> int:
    """N as the kernels get it. The ports pad x and the mask with zeros up to it: a padded position k has mask 0, so
    its left and right projections are 0 and add exactly nothing to any product; padded rows i and columns j of the
    output are cut off. Real proteins come in any length."""
    return -(-seq // multiple) * multiple


def shard_rows(seq: int, shards: int, tiles, what: str) -> int:
    """The rows i each of `shards` ranks or devices (`what`) takes of a sequence padded to `seq`, or a ValueError
    where they do not split evenly into rows whose pairs (b, i, k) fill the kernels' tiles of pairs."""
    tile_pairs = max(tiles.norm_rows, tiles.rows, tiles.output_rows)
    if seq % shards or (seq // shards) * seq % tile_pairs:
        raise ValueError(f"the sequence padded to {seq} does not split over {shards} {what} into rows whose pairs "
                         f"fill the kernels' tiles ({tile_pairs} pairs)")
    return seq // shards


def padded_inputs(x: torch.Tensor, mask: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, N, N, dim] and mask [B, N, N] zero-padded to N = seq (see padded_length), for the torch-side ports."""
    length = x.shape[1]
    if seq == length:
        return x, mask
    return (F.pad(x, (0, 0, 0, seq - length, 0, seq - length)), F.pad(mask, (0, seq - length, 0, seq - length)))


def scratch(device, poison: bool):
    """A port's allocator of intermediate buffers, `scratch(device, poison)(shape, dtype)`: uninitialised, or with
    poison all NaN, so that a tile a kernel fails to write shows in the output."""
    if poison:
        return lambda shape, dtype: torch.full(shape, float("nan"), device=device, dtype=dtype)
    return lambda shape, dtype: torch.empty(shape, device=device, dtype=dtype)


def check_kernel_sizes(batch: int, seq: int, dim: int, hidden: int) -> None:
    """Raise a ValueError naming the size that no kernel port takes."""
    if dim % 32:
        raise ValueError(f"the kernel ports need dim (x.shape[3]) to be a multiple of 32, got {dim}")
    if hidden not in (16, 32, 64, 128):
        raise ValueError(f"the kernel ports need hidden_dim in (16, 32, 64, 128), got {hidden}")
    if batch * seq * seq * max(dim, 3 * hidden) >= 2**31:
        raise ValueError(f"the kernel ports index with 32-bit offsets: B*N*N*max(dim, 3*hidden) must be "
                         f"below 2**31, got B={batch} N={seq} dim={dim} hidden={hidden}")


def kernel_tiling(batch: int, seq: int, dim: int, hidden: int) -> TriMulTiling:
    """The ports' tiles for these sizes, or a ValueError naming the size the kernels cannot take."""
    if seq % SEQUENCE_MULTIPLE:
        raise ValueError(f"the kernels need N padded to a multiple of {SEQUENCE_MULTIPLE} (padded_length), got {seq}")
    check_kernel_sizes(batch, seq, dim, hidden)
    contract = largest_power_of_two_dividing(seq, 128)
    # LayerNorm rows: the fewest that keep an ahead-of-time sm_90 compile from spilling its [rows, dim] block
    # (128 rows spill: docs/findings.md, "Results on an NVIDIA H200", "TriMul")
    return TriMulTiling(rows=128, norm_rows=64 if dim <= 128 else 32, tile_dim=largest_power_of_two_dividing(dim, 64),
                        tile_out=largest_power_of_two_dividing(dim, 128),
                        tile_i=contract, tile_j=contract, tile_k=min(contract, 64))


class Float16RangeError(ValueError):
    """A TriMul kernel port's float16 intermediates could not hold this input's range, or the input is not finite."""


def _refusal(port: str) -> Float16RangeError:
    return Float16RangeError(
        f"the {port} TriMul port's output is not finite: this input's range overflows its float16 intermediates "
        f"(the projections and the triangle products must stay within +-65504), or the input holds inf or NaN; "
        f"the float32 implementations (torch, torch_compile, jax_xla) take such inputs")


def refuse_non_finite(column_sum, port: str) -> None:
    """Raise Float16RangeError unless `column_sum`, the sum of column 0 of the port's output (a 0-d tensor or array),
    is finite (the JAX ports' range check; the torch ports check the flags of `float16_weights` with `refuse_flagged`
    instead, on the device).

    The kernel ports keep LayerNorm's output, the gated projections and the triangle products in float16, whose
    largest value is 65504. An overflow in any of them reaches the output LayerNorm of the pairs (i, j) it feeds as
    inf or NaN, and that LayerNorm then makes every element of those pairs' output rows NaN: so column 0 tells, and
    its sum (one reduction kernel) is finite exactly where each of its elements is, unless the sum itself passes
    float32's range. An overflow of the last float16 cast, the normalised product before the output projection,
    reaches every output column as inf or NaN too. The cost a call: a strided read of B*N*N floats and one
    synchronisation.

    Inside a caller's jit around a JAX port the sum is not known while tracing: the refusal then runs as a callback
    when the computation does, and JAX raises it inside its runtime error.
    """
    jax = sys.modules.get("jax")  # never imported for the torch ports
    if jax is not None and isinstance(column_sum, jax.core.Tracer):
        jax.debug.callback(functools.partial(refuse_non_finite, port=port), column_sum)
        return
    if jax is not None and isinstance(column_sum, jax.Array):  # read by torch: JAX's own float() is slower
        column_sum = torch.from_dlpack(column_sum)  # (results/h200/experiments/call-cost-profiles/)
    if not math.isfinite(float(column_sum)):
        raise _refusal(port)


@triton.jit
def any_not_finite(value):
    """1 where an element of the 2-d tile `value` is inf or NaN, else 0 (an int32 scalar)."""
    return tl.max(tl.max(((value != value) | (tl.abs(value) == float("inf"))).to(tl.int32), axis=1), axis=0)


WEIGHT_BLOCK = 128  # the most columns of a weight matrix one program of `_float16_weights_kernel` casts


@triton.jit
def _float16_weights_kernel(left_proj_ptr, left_gate_ptr, right_proj_ptr, right_gate_ptr, out_gate_ptr, to_out_ptr,
                            out_ptr, flags_ptr, HIDDEN: tl.constexpr, CHANNELS: tl.constexpr, DIM: tl.constexpr,
                            BLOCK: tl.constexpr):
    """Program (m, c): columns [c*BLOCK, (c+1)*BLOCK) of weight matrix m as float16 into out [6, CHANNELS, DIM]: the
    five projections' [HIDDEN, DIM] weights as they are, to_out's [DIM, HIDDEN] transposed, each padded with zero
    rows up to CHANNELS. Each program writes its flag, flags[1 + m * (DIM // BLOCK) + c], 1 where a value it wrote is
    not finite (a weight beyond float16's range, or inf or NaN), and program (0, 0) zeroes flags[0], which the port's
    output kernel sets later in the call."""
    matrix = tl.program_id(0)
    chunk = tl.program_id(1)
    source = left_proj_ptr
    if matrix == 1:
        source = left_gate_ptr
    if matrix == 2:
        source = right_proj_ptr
    if matrix == 3:
        source = right_gate_ptr
    if matrix == 4:
        source = out_gate_ptr
    if matrix == 5:
        source = to_out_ptr
    rows = tl.arange(0, CHANNELS)[:, None]
    cols = chunk * BLOCK + tl.arange(0, BLOCK)[None, :]
    offsets = tl.where(matrix == 5, cols * HIDDEN + rows, rows * DIM + cols)
    value = tl.load(source + offsets, mask=rows < HIDDEN, other=0.0).to(tl.float16)
    tl.store(out_ptr + (matrix * CHANNELS + rows) * DIM + cols, value)
    tl.store(flags_ptr + 1 + matrix * (DIM // BLOCK) + chunk, any_not_finite(value))
    if matrix == 0 and chunk == 0:
        tl.store(flags_ptr, 0)


def float16_weights(projections: list, to_out: torch.Tensor, hidden: int, channels: int, dim: int, launch):
    """The five projection weights (`projections`, [hidden, dim] each, in the kernels' order: ports.trimul.PROJECTIONS)
    and to_out's ([dim, hidden]), in float16 with their rows padded to `channels` with zeros, in one launch (through
    the port's `launch`): ([5 * channels, dim] projections stacked, [channels, dim] to_out's weight transposed, the
    range flags). The flags ([1 + 6 * dim / block] int32) are set by the launch's programs and, in flags[0], by the
    port's output kernel: `refuse_flagged` checks them."""
    block = largest_power_of_two_dividing(dim, WEIGHT_BLOCK)
    out = torch.empty((6 * channels, dim), device=to_out.device, dtype=torch.float16)
    flags = torch.empty((1 + 6 * (dim // block),), device=to_out.device, dtype=torch.int32)
    launch(_float16_weights_kernel, (6, dim // block), *(weight.contiguous() for weight in projections),
           to_out.contiguous(), out, flags, HIDDEN=hidden, CHANNELS=channels, DIM=dim, BLOCK=block, num_warps=4)
    return out[:5 * channels], out[5 * channels:], flags


@triton.jit(debug=True)  # debug: Triton compiles a device_assert only into a kernel built with it
def _range_assertion_kernel(flags_ptr, COUNT: tl.constexpr, BLOCK: tl.constexpr):
    """One program: a device-side assertion that every range flag (`float16_weights`) is 0. A set flag stops the
    launch with the message below, and the CUDA context with it: torch raises at its next synchronisation."""
    index = tl.arange(0, BLOCK)
    flags = tl.load(flags_ptr + index, mask=index < COUNT, other=0)
    tl.device_assert(flags == 0, "TriMul kernel port: this input's range overflows its float16 intermediates (or "
                                 "holds inf or NaN); the float32 implementations take it")


INTERPRETED = triton.knobs.runtime.interpret  # the Triton interpreter runs the kernels: it compiles no assertion


def refuse_flagged(flags: torch.Tensor, port: str, launch, *, on_host: bool) -> None:
    """Refuse the call where a range flag of the call (`float16_weights`) is set: a float16 weight or normalised
    product not finite. The torch ports' range check: the flags are set inside kernels the call runs anyway, and
    they miss no float16 value the output is made from: every one is a weight, or feeds the output LayerNorm's
    normalised product (see refuse_non_finite). Stricter than the column sum in one way: a gate weight beyond
    float16's range is refused even where the gate's sigmoid saturates and the answer would have been right.

    on_host=False (the ports' default): a device-side assertion reads them (`_range_assertion_kernel`, one launch
    through the port's `launch`), so the call never waits for the device; an overflow stops the process's CUDA
    context, and torch raises at its next synchronisation, before any value of the output can be read. on_host=True,
    and always under Triton's interpreter: the flags are read back (one synchronisation) and Float16RangeError is
    raised, which a caller can catch and go on."""
    if on_host or INTERPRETED:
        if any(flags.tolist()):
            raise _refusal(port)
        return
    launch(_range_assertion_kernel, (1,), flags, COUNT=flags.numel(), BLOCK=triton.next_power_of_2(flags.numel()))
