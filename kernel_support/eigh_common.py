"""What the eigh ports share: the algorithm's parameters, the heuristics that pick a launch's shape for a batch and
n, and the kernels' size limit.

The Triton and Pallas ports run the same algorithm, stage for stage, with the same values, so these live once, here,
beside the spec (ports/eigh.py); what only one port uses lives in its stage module (the Pallas Jacobi's exchange
warps, the Triton port's register caps). Each constant says why in a line; the A/B runs and CPU prototypes that chose
it are in docs/findings.md, "The eigh ports' tuning constants".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

JACOBI_MAX_SWEEPS = 15  # parallel-order Jacobi converges quadratically: well inside this once each round zeroes
# its pairs
JACOBI_MAX_N = 64  # the on-chip kernel holds A and V (and their exchanged copies) in registers
# n > 64: tridiagonalisation, bisection, inverse iteration, back-transformation (both ports; the kernels' docstrings
# say how). Inverse iteration shifts by the computed eigenvalue itself, and by one shift per group of eigenvalues
# closer than GROUP_GAP eps ||T||: one shift for all, or none, failed some family in the CPU prototype.
TILE = 8192  # elements of a register tile in the row-sweeping kernels (ROWS x padded n)
TRIDIAGONAL_PANEL = 16  # columns per panel of the blocked one-launch tridiagonalisation
TRIDIAGONAL_ROWS = 16  # trailing-matrix rows swept at a time for few matrices, on TRIDIAGONAL_WARPS warps (the
TRIDIAGONAL_WARPS = 4  # fastest of the settings swept)
MANY_TRIDIAGONAL_ROWS = 8  # the same from ONE_LAUNCH_BATCH matrices on (`tridiagonal_tile`), where programs queue
MANY_TRIDIAGONAL_WARPS = 2
PANEL_CHUNK = 4  # members of a panel's V and W the one-launch kernel's W row reads at a time, and columns of the
TRIDIAGONAL_COLS = 64  # trailing matrix its update takes at a time: whole 16 x padded-n tiles spilled registers
MANY_TRIDIAGONAL_PRODUCT_STAGES = 3  # from ONE_LAUNCH_BATCH matrices on, the Triton port's one-launch product loads its
# row tiles this many stages ahead (`tl.range(..., num_stages=...)`), for DRAM bandwidth; Pallas loops take no stages
SYMMETRIC_PRODUCT_WARP_ROWS = 16  # the one-launch kernel's product p = A v walks the lower triangle in tiles of
SYMMETRIC_PRODUCT_COLS = 64  # SYMMETRIC_PRODUCT_COLS columns and SYMMETRIC_PRODUCT_WARP_ROWS rows a warp, no wider
# than the triangle it reads. The columns a power of two (blocks tile the padded n) and a multiple of 4: a block's
# sweep starts at its first row, so no 4-column diagonal block of `_lower_blocks` may straddle two blocks
OVER_LAUNCHES_PRODUCT_ROWS = 16  # over launches, each product program walks its row tiles of OVER_LAUNCHES_PRODUCT_ROWS
OVER_LAUNCHES_PRODUCT_BLOCKS = 4  # rows on OVER_LAUNCHES_PRODUCT_WARPS warps in column blocks of a padded row's
OVER_LAUNCHES_PRODUCT_WARPS = 4  # 1 / OVER_LAUNCHES_PRODUCT_BLOCKS, up to the tile's diagonal (faster than full-width
# tiles in both ports); the blocks, as the one-launch kernel's, hold whole 4-column diagonal blocks
COLUMN_KERNEL_WARPS = 8  # warps of the over-launches column kernel, one program a matrix, latency-bound by its chain
# of reductions
PANEL_UPDATE_COLS = 128  # columns per program of the over-launches per-panel trailing update (not swept)
PRODUCT_PROGRAMS = 32  # at most this many product programs a matrix: each leaves a share of the column sums (the
# product reads the lower triangle only) that the next launch, one program a matrix, adds up
ONE_LAUNCH_BATCH = 256  # from this many matrices on, or below ONE_LAUNCH_N, the whole tridiagonalisation is one
ONE_LAUNCH_N = 512  # launch, one program per matrix: enough programs to fill the GPU, or too little work per column
# to pay for two launches a column
ONE_LAUNCH_MAX_N = 1024  # but not above: the blocked kernel's products stage V's and W's 16 x padded-n panels in
# shared memory, which at a padded 2048 exceeds what one program may have on sm_90
LANES = 32  # eigenvalues per program in the bisection and inverse-iteration kernels (one warp)
SPLIT_GRAM_SCHMIDT_N = 512  # from this n on, the clusters' Gram-Schmidt shares each panel's projections among many
# programs a matrix as products (`gram_schmidt_shares`), four launches a panel; below it, one program per matrix
GRAM_SCHMIDT_EARLIER = 64  # each split projection program takes this many earlier cluster members E and forms
GRAM_SCHMIDT_CHUNK = 64  # (P E^T) E for the panel block P, GRAM_SCHMIDT_CHUNK columns a product step, on
GRAM_SCHMIDT_WARPS = 4  # GRAM_SCHMIDT_WARPS warps, in GRAM_SCHMIDT_PRECISION (the fastest setting swept; float32
GRAM_SCHMIDT_PRECISION = "tf32x3"  # products run on CUDA cores, slower)
CUDA_GRAPH_SHAPES = 4  # the Triton port replays its path (Jacobi or tridiagonal) for fewer than ONE_LAUNCH_BATCH
# matrices from a CUDA graph, for this many shapes at most (0: launch every kernel from Python): launches dominate
# there
# The back-transformation (compact WY panels, tensor-core products): the fastest, or near it on every row tried, of
# the reflectors, chunks, vectors and warps swept.
BACK_TRANSFORM_VECTORS = 64  # eigenvectors a program: the rows of one warp group's products
BACK_TRANSFORM_REFLECTORS = 64  # reflectors a panel: the compact WY form's width
BACK_TRANSFORM_CHUNK = 32  # columns of Z^T and V^T a product step takes (its K)
BACK_TRANSFORM_WARPS = 4  # per program, in both of its kernels
BACK_TRANSFORM_PRECISION = "tf32x3"  # three TF32 tensor-core passes, about float32's accuracy ("ieee" products run on
# CUDA cores, far slower)
SECOND_PASS_BELOW = 0.9  # a Gram-Schmidt panel's second pass runs only if a vector's norm fell below this in the first
# (Kahan's test; dense spectra almost never need it)
PANEL = 16  # vectors per block of the clusters' Gram-Schmidt (each step is PANEL row operations)
BISECTION_ITERATIONS = 26  # brackets as narrow as this many halvings of T's Gershgorin interval (width <= 2 ||T||)
# leave them, eps ||T|| / 4, below the Sturm count's own error of a few eps ||T|| (every check is relative to ||A||);
# also the most halvings a bracket takes after the kernels' first pass, a multisection (32 Sturm counts a warp, at
# the same points in every warp, cut each bracket to 1/33 of the interval, about 5 halvings)
PIVOT_FLOOR = 1e-30  # Sturm-count pivots of T / max|A| are kept at least this far from zero
INVERSE_ITERATIONS = 3  # with the repair below, the fewest rounds that left no failure on the big bench rows
REPAIR_RESIDUAL = 500  # a vector with ||T x - value x|| above this many eps ||T|| after the last round is made
# orthogonal to all the sound ones: the rare vector whose cluster Gram-Schmidt cancelled nearly all of it keeps
# rounding along far clusters' vectors; sound vectors stay far below this
GROUP_GAP = 5  # eigenvalues closer than this many eps ||T|| share an inverse-iteration shift, half a gap below the
# group's first. A group chains its gaps, and the eigenvalue below it is only half a gap from the shift, so a wide
# group's vectors come out mixed with that neighbour, which the last Gram-Schmidt carries down a long chained cluster:
# wider gaps failed the mixed row, narrower ones the geometric rows; the failing 512 T of tests/test_eigh_stages.py
# shows the choice is a threshold, not a cure
SPARSE_GROUP_GAP = 1  # a group whose mean gap is at least this many eps ||T|| is sparse. A dense group keeps the shared
# shift; in a sparse one, each run of eigenvalues closer than this shares a shift half this gap below its first, and
# every other member shifts by its own eigenvalue. A shared shift puts a wide group's top members far from it, nearer
# the eigenvalue above the group than their own (the psd family's smallest eigenvalues); own shifts everywhere
# spoiled the clustered and repeated families
CLUSTER_GAP = 1e-3  # eigenvalues closer than this times ||T||_2 are orthogonalised against each other (LAPACK's
# dstein, which measures with the 1-norm: for a dense random matrix that is about 0.4 sqrt(n) times larger, and the
# clusters it chains up, hundreds of vectors long at n = 512, cost most of the Gram-Schmidt's time)
EARLY_CLUSTER_GAP = 1e-5  # the same in the rounds before the last: there only pairs this close need it, since inverse
# iteration shrinks a neighbour's share by about eps ||T|| / gap a round


SECULAR_STEPS = 40  # bisection steps a root of the divide and conquer's secular equation: within 2^-40 of its half
# gap, past where the CPU prototype's residual settles (results/h200/experiments/eigh-prototypes/)
SECULAR_ROOTS = 32  # roots (or poles) a program of the divide and conquer's secular, z and vector kernels
SECULAR_CHUNK = 64  # the other side's entries a step of those kernels' loops
MERGE_TILE = 64  # rows and columns of a merge's new vectors a program of its product
MERGE_TILE_K = 32  # the merge's kept columns a step of that product takes


def check_offsets(batch: int, size: int, per_matrix: int = 1) -> None:
    """The eigh kernels index with 32-bit offsets: a ValueError naming the sizes when batch * per_matrix * size^2
    is too large (per_matrix: size x size arrays a matrix in the largest buffer, as the Pallas Jacobi's exchange)."""
    if batch * per_matrix * size * size >= 2**31:
        raise ValueError(f"the eigh kernels index with 32-bit offsets: batch * {per_matrix} * padded n^2 must be below "
                         f"2**31, got batch = {batch}, padded n = {size}")


def row_blocks(n: int) -> tuple[int, int, int]:
    """(padded n, rows a block, blocks a matrix) of the symmetrize kernel, which reads A and A^T a row block of TILE
    elements at a time (and checks them)."""
    block_n = 1 << (n - 1).bit_length()
    rows = max(1, TILE // block_n)
    return block_n, rows, -(-n // rows)


def one_launch(batch: int, n: int) -> bool:
    """Whether the tridiagonalisation runs in one launch (one program per matrix) rather than over launches."""
    return (batch >= ONE_LAUNCH_BATCH or n < ONE_LAUNCH_N) and n <= ONE_LAUNCH_MAX_N


def tridiagonal_tile(batch: int) -> tuple[int, int]:
    """(rows a tile, warps) of the one-launch tridiagonalisation. Few matrices leave each program an SM to itself,
    and 16-row tiles on 4 warps shorten its chain of row tiles; from ONE_LAUNCH_BATCH matrices on, programs share
    the SMs and 8-row tiles on 2 warps fit more of them (each faster where it is taken, in both ports)."""
    if shares_the_sms(batch):
        return MANY_TRIDIAGONAL_ROWS, MANY_TRIDIAGONAL_WARPS
    return TRIDIAGONAL_ROWS, TRIDIAGONAL_WARPS


def product_stages(batch: int) -> int:
    """Software-pipelining stages of the Triton port's one-launch product loop (1: none):
    MANY_TRIDIAGONAL_PRODUCT_STAGES where programs share the SMs (`tridiagonal_tile`)."""
    return MANY_TRIDIAGONAL_PRODUCT_STAGES if shares_the_sms(batch) else 1


def gram_schmidt_unrolled(batch: int) -> bool:
    """Whether the Gram-Schmidt's within-panel step runs unrolled (PANEL copies of its code) or as a loop: a loop
    where programs share the SMs (`shares_the_sms`): there the unrolled finish, two programs an SM by its
    registers, stalls on instruction fetch; with few matrices the loop gains nothing."""
    return not shares_the_sms(batch)


def shares_the_sms(batch: int) -> bool:
    """Whether the one-launch tridiagonalisation's programs share the SMs: from ONE_LAUNCH_BATCH matrices on."""
    return batch >= ONE_LAUNCH_BATCH


def product_programs(below: int) -> int:
    """Programs a matrix of the product p = A v_j over the `below` = n - j - 1 rows below column j, when the
    tridiagonalisation runs over launches: one row tile of OVER_LAUNCHES_PRODUCT_ROWS each, PRODUCT_PROGRAMS at
    most."""
    return max(1, min(PRODUCT_PROGRAMS, -(-below // OVER_LAUNCHES_PRODUCT_ROWS)))


def column_panel_chunk(block_n: int) -> int:
    """Members of V and W read at a time by the over-launches column kernel's W row: PANEL_CHUNK from a padded
    2048, where whole panels spill, else the whole panel."""
    return PANEL_CHUNK if block_n > 1024 else TRIDIAGONAL_PANEL


def split_gram_schmidt(n: int) -> bool:
    """Whether the clusters' Gram-Schmidt shares each panel's projections among many programs per matrix (four
    launches a panel) rather than running one program per matrix."""
    return n >= SPLIT_GRAM_SCHMIDT_N


def gram_schmidt_shares(n: int) -> tuple[int, int]:
    """(programs a matrix, earlier cluster members a program) of the split Gram-Schmidt's projections: enough
    programs of GRAM_SCHMIDT_EARLIER members for a cluster of n."""
    return -(-n // GRAM_SCHMIDT_EARLIER), GRAM_SCHMIDT_EARLIER


def jacobi_size(n: int) -> int:
    """The power of two the on-chip Jacobi pads n to: at least 16, the smallest tile the ports are tested and
    timed at (it was the smallest tile of the Pallas port's earlier exchange products)."""
    if n > JACOBI_MAX_N:
        raise ValueError(f"the on-chip Jacobi takes n <= {JACOBI_MAX_N}, got n = {n}")
    return max(16, 1 << (n - 1).bit_length())


def vector_panel_warps(block_n: int) -> int:
    """Warps per program for the kernels that sweep a matrix's vectors PANEL rows of block_n at a time (the
    one-program Gram-Schmidt and the repair): one per 64 elements of a row, 4 to 16."""
    return min(16, max(4, block_n // 64))


def gram_schmidt_finish_warps(block_n: int) -> int:
    """Warps of the split Gram-Schmidt's finish (one program a matrix, a chain of row reductions across its warps):
    one per 128 elements of a row, 4 to 16, half of `vector_panel_warps` at 512 and 1024 (faster in the Triton
    port; the Pallas port's finish kernels took the same time either way)."""
    return min(16, max(4, block_n // 128))


def jacobi_warps(size: int) -> int:
    """Warps per program for the Triton port's N x N on-chip Jacobi (elementwise rounds): 4 up to N = 32 (faster
    than 8 there), 8 for N = 64. The Pallas
    port's rounds wait on its exchange through memory and take its own JACOBI_EXCHANGE_WARPS."""
    return 4 if size <= 32 else 8


@functools.lru_cache(maxsize=None)
def merge_levels(n: int) -> list[tuple[int, list[tuple[int, int, int]], list[tuple[int, int]]]]:
    """The divide and conquer's tears of n rows, halved down to single rows, as merges grouped by height (a merge
    waits for its halves only), each level as (the power of two over its largest merge, [(start, left size, size)],
    the carried blocks [(start, size)]).

    The levels write two buffers of eigenvectors in turn (level l reads buffer l % 2 and writes the other), both
    the identity at first: a merge writes the whole of its block, and nothing outside its block, so a buffer needs
    no copy of the other but where a merge's half was written by a level of the same parity as this one (a half two
    or four levels lower, where the halves' heights differ): those halves' blocks are the level's carried blocks,
    copied into the buffer it reads before it runs. Single rows are the identity's in both buffers."""
    merges: dict[int, list[tuple[int, int, int]]] = {}
    carried: dict[int, list[tuple[int, int]]] = {}

    def split(start, size):
        if size == 1:
            return 0
        left = size // 2
        heights = split(start, left), split(start + left, size - left)
        height = 1 + max(heights)
        merges.setdefault(height, []).append((start, left, size))
        for (begin, rows), below in zip(((start, left), (start + left, size - left)), heights):
            if below and below % 2 == height % 2:  # written into buffer below % 2, read from (height - 1) % 2
                carried.setdefault(height, []).append((begin, rows))
        return height

    split(0, n)
    return [(1 << (max(size for _, _, size in group) - 1).bit_length(), group, carried.get(height, []))
            for height, group in sorted(merges.items())]


@dataclass(frozen=True)
class MergeTiling:
    """A divide and conquer level's tiles, for merges of `block` rows (`merge_tiling`)."""

    ranked: int  # other entries a step of the merge-wide kernels (prepare, order), which compare [block, step] tiles
    warps: int  # those kernels' warps
    lanes: int  # roots a program of the secular, z and vector kernels
    chunk: int  # entries a step of those kernels
    tile: int  # the product's tile: rows and columns
    tile_k: int  # the product's tile's K


def merge_tiling(block: int) -> MergeTiling:
    """About 4096 entries a step of the merge-wide kernels, and 8 warps from 512 rows; the product's tiles at most
    half the block, so that a merge of two equal halves has no tile across them, and at least 16 (a tensor-core
    product's least)."""
    return MergeTiling(ranked=max(2, min(SECULAR_CHUNK, 4096 // block)), warps=4 if block <= 256 else 8,
                       lanes=min(SECULAR_ROOTS, block), chunk=min(SECULAR_CHUNK, block),
                       tile=max(16, min(MERGE_TILE, block // 2)), tile_k=max(16, min(MERGE_TILE_K, block)))