"""What the eigh ports share: the algorithm's parameters, the heuristics that pick a launch's shape for a batch and
n, and the kernels' size limit.

The Triton and Pallas ports run the same algorithm, stage for stage, with the same values, so these live once, here,
beside the spec (ports/eigh.py): one frozen dataclass a stage, each tunable a field with its default, the heuristics
that read them its methods, and one instance a stage (`JACOBI`, `TRIDIAGONAL`, ...) that the ports import. What only
one port uses lives in its stage module, as a small dataclass of its own (the Pallas Jacobi's exchange warps, the
Triton port's CUDA graphs). Each field says why in a comment; the A/B runs and CPU prototypes that chose it are in
docs/findings.md, "The eigh ports' tuning constants".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass


def check_offsets(batch: int, size: int, per_matrix: int = 1) -> None:
    """The eigh kernels index with 32-bit offsets: a ValueError naming the sizes when batch * per_matrix * size^2
    is too large (per_matrix: size x size arrays a matrix in the largest buffer, as the Pallas Jacobi's exchange)."""
    if batch * per_matrix * size * size >= 2**31:
        raise ValueError(f"the eigh kernels index with 32-bit offsets: batch * {per_matrix} * padded n^2 must be below "
                         f"2**31, got batch = {batch}, padded n = {size}")


@dataclass(frozen=True)
class Jacobi:
    """The on-chip Jacobi, n <= max_n."""

    max_sweeps: int = 15  # parallel-order Jacobi converges quadratically: well inside this once each round zeroes
    # its pairs
    max_n: int = 64  # the on-chip kernel holds A and V (and their exchanged copies) in registers
    # n > 64: tridiagonalisation, bisection, inverse iteration, back-transformation (both ports; the kernels'
    # docstrings say how)

    def size(self, n: int) -> int:
        """The power of two the on-chip Jacobi pads n to: at least 16, the smallest tile the ports are tested and
        timed at (it was the smallest tile of the Pallas port's earlier exchange products)."""
        if n > self.max_n:
            raise ValueError(f"the on-chip Jacobi takes n <= {self.max_n}, got n = {n}")
        return max(16, 1 << (n - 1).bit_length())

    def warps(self, size: int) -> int:
        """Warps per program for the Triton port's N x N on-chip Jacobi (elementwise rounds): 4 up to N = 32 (faster
        than 8 there), 8 for N = 64. The Pallas port's rounds wait on its exchange through memory and take its own
        `PALLAS_JACOBI.exchange_warps`."""
        return 4 if size <= 32 else 8


@dataclass(frozen=True)
class Tridiagonal:
    """The Householder tridiagonalisation: the symmetrize kernel's row blocks, the one-launch kernel's tiles and
    symmetric product, the over-launches kernels' tiles, and the choice between the two."""

    symmetrize_tile: int = 8192  # elements of a register tile in the row-sweeping kernels (rows x padded n:
    # `row_blocks`)
    panel: int = 16  # columns per panel of the blocked one-launch tridiagonalisation
    rows: int = 16  # trailing-matrix rows swept at a time for few matrices, on `warps` warps (the fastest of the
    warps: int = 4  # settings swept)
    many_rows: int = 8  # the same from one_launch_batch matrices on (`tile`), where programs queue
    many_warps: int = 2
    panel_chunk: int = 4  # members of a panel's V and W the one-launch kernel's W row reads at a time, and columns
    cols: int = 64  # of the trailing matrix its update takes at a time: whole 16 x padded-n tiles spilled registers
    many_product_stages: int = 3  # from one_launch_batch matrices on, the Triton port's one-launch product loads its
    # row tiles this many stages ahead (`tl.range(..., num_stages=...)`), for DRAM bandwidth; Pallas loops take no
    # stages
    product_warp_rows: int = 16  # the one-launch kernel's product p = A v walks the lower triangle in tiles of
    product_cols: int = 64  # product_cols columns and product_warp_rows rows a warp, no wider than the triangle it
    # reads. The columns a power of two (blocks tile the padded n) and a multiple of 4: a block's sweep starts at
    # its first row, so no 4-column diagonal block of `_lower_blocks` may straddle two blocks
    over_launches_product_rows: int = 16  # over launches, each product program walks its row tiles of
    over_launches_product_blocks: int = 4  # over_launches_product_rows rows on over_launches_product_warps warps in
    over_launches_product_warps: int = 4  # column blocks of a padded row's 1 / over_launches_product_blocks, up to
    # the tile's diagonal (faster than full-width tiles in both ports); the blocks, as the one-launch kernel's, hold
    # whole 4-column diagonal blocks
    column_kernel_warps: int = 8  # warps of the over-launches column kernel, one program a matrix, latency-bound by
    # its chain of reductions
    panel_update_cols: int = 128  # columns per program of the over-launches per-panel trailing update (not swept)
    max_product_programs: int = 32  # at most this many product programs a matrix: each leaves a share of the
    # column sums (the product reads the lower triangle only) that the next launch, one program a matrix, adds up
    one_launch_batch: int = 256  # from this many matrices on, or below one_launch_n, the whole tridiagonalisation is
    one_launch_n: int = 512  # one launch, one program per matrix: enough programs to fill the GPU, or too little
    # work per column to pay for two launches a column
    one_launch_max_n: int = 1024  # but not above: the blocked kernel's products stage V's and W's 16 x padded-n
    # panels in shared memory, which at a padded 2048 exceeds what one program may have on sm_90

    def row_blocks(self, n: int) -> tuple[int, int, int]:
        """(padded n, rows a block, blocks a matrix) of the symmetrize kernel, which reads A and A^T a row block of
        symmetrize_tile elements at a time (and checks them)."""
        block_n = 1 << (n - 1).bit_length()
        rows = max(1, self.symmetrize_tile // block_n)
        return block_n, rows, -(-n // rows)

    def one_launch(self, batch: int, n: int) -> bool:
        """Whether the tridiagonalisation runs in one launch (one program per matrix) rather than over launches."""
        return (batch >= self.one_launch_batch or n < self.one_launch_n) and n <= self.one_launch_max_n

    def shares_the_sms(self, batch: int) -> bool:
        """Whether the one-launch tridiagonalisation's programs share the SMs: from one_launch_batch matrices on."""
        return batch >= self.one_launch_batch

    def tile(self, batch: int) -> tuple[int, int]:
        """(rows a tile, warps) of the one-launch tridiagonalisation. Few matrices leave each program an SM to
        itself, and 16-row tiles on 4 warps shorten its chain of row tiles; from one_launch_batch matrices on,
        programs share the SMs and 8-row tiles on 2 warps fit more of them (each faster where it is taken, in both
        ports)."""
        if self.shares_the_sms(batch):
            return self.many_rows, self.many_warps
        return self.rows, self.warps

    def product_stages(self, batch: int) -> int:
        """Software-pipelining stages of the Triton port's one-launch product loop (1: none): many_product_stages
        where programs share the SMs (`tile`)."""
        return self.many_product_stages if self.shares_the_sms(batch) else 1

    def product_programs(self, below: int) -> int:
        """Programs a matrix of the product p = A v_j over the `below` = n - j - 1 rows below column j, when the
        tridiagonalisation runs over launches: one row tile of over_launches_product_rows each,
        max_product_programs at most."""
        return max(1, min(self.max_product_programs, -(-below // self.over_launches_product_rows)))

    def column_panel_chunk(self, block_n: int) -> int:
        """Members of V and W read at a time by the over-launches column kernel's W row: panel_chunk from a padded
        2048, where whole panels spill, else the whole panel."""
        return self.panel_chunk if block_n > 1024 else self.panel


@dataclass(frozen=True)
class Bisection:
    """T's eigenvalues from Sturm counts, one lane an eigenvalue."""

    lanes: int = 32  # eigenvalues per program of the bisection kernel (one warp)
    iterations: int = 26  # brackets as narrow as this many halvings of T's Gershgorin interval (width <= 2 ||T||)
    # leave them, eps ||T|| / 4, below the Sturm count's own error of a few eps ||T|| (every check is relative to
    # ||A||); also the most halvings a bracket takes after the kernels' first pass, a multisection (32 Sturm counts
    # a warp, at the same points in every warp, cut each bracket to 1/33 of the interval, about 5 halvings)
    pivot_floor: float = 1e-30  # Sturm-count pivots of T / max|A| are kept at least this far from zero


@dataclass(frozen=True)
class InverseIteration:
    """T's eigenvectors by inverse iteration, each round followed by the clusters' Gram-Schmidt, then the repair.
    It shifts by the computed eigenvalue itself, and by one shift per group of eigenvalues closer than group_gap
    eps ||T||: one shift for all, or none, failed some family in the CPU prototype."""

    lanes: int = 32  # eigenvalues per program of the inverse-iteration kernel (one warp)
    rounds: int = 3  # with the repair below, the fewest rounds that left no failure on the big bench rows
    repair_residual: float = 500  # a vector with ||T x - value x|| above this many eps ||T|| after the last round is
    # made orthogonal to all the sound ones: the rare vector whose cluster Gram-Schmidt cancelled nearly all of it
    # keeps rounding along far clusters' vectors; sound vectors stay far below this
    group_gap: float = 5  # eigenvalues closer than this many eps ||T|| share an inverse-iteration shift, half a gap
    # below the group's first. A group chains its gaps, and the eigenvalue below it is only half a gap from the
    # shift, so a wide group's vectors come out mixed with that neighbour, which the last Gram-Schmidt carries down a
    # long chained cluster: wider gaps failed the mixed row, narrower ones the geometric rows; the failing 512 T of
    # tests/test_eigh_stages.py shows the choice is a threshold, not a cure
    sparse_group_gap: float = 1  # a group whose mean gap is at least this many eps ||T|| is sparse. A dense group
    # keeps the shared shift; in a sparse one, each run of eigenvalues closer than this shares a shift half this gap
    # below its first, and every other member shifts by its own eigenvalue. A shared shift puts a wide group's top
    # members far from it, nearer the eigenvalue above the group than their own (the psd family's smallest
    # eigenvalues); own shifts everywhere spoiled the clustered and repeated families
    cluster_gap: float = 1e-3  # eigenvalues closer than this times ||T||_2 are orthogonalised against each other
    # (LAPACK's dstein, which measures with the 1-norm: for a dense random matrix that is about 0.4 sqrt(n) times
    # larger, and the clusters it chains up, hundreds of vectors long at n = 512, cost most of the Gram-Schmidt's
    # time)
    early_cluster_gap: float = 1e-5  # the same in the rounds before the last: there only pairs this close need it,
    # since inverse iteration shrinks a neighbour's share by about eps ||T|| / gap a round


@dataclass(frozen=True)
class GramSchmidt:
    """The clusters' block Gram-Schmidt: one program a matrix, or from split_n on each panel's projections shared
    among many programs."""

    panel: int = 16  # vectors per block of the clusters' Gram-Schmidt (each step is `panel` row operations)
    split_n: int = 512  # from this n on, the clusters' Gram-Schmidt shares each panel's projections among many
    # programs a matrix as products (`shares`), four launches a panel; below it, one program per matrix
    earlier: int = 64  # each split projection program takes this many earlier cluster members E and forms
    chunk: int = 64  # (P E^T) E for the panel block P, `chunk` columns a product step, on
    warps: int = 4  # `warps` warps, in `precision` (the fastest setting swept; float32
    precision: str = "tf32x3"  # products run on CUDA cores, slower)
    second_pass_below: float = 0.9  # a Gram-Schmidt panel's second pass runs only if a vector's norm fell below this
    # in the first (Kahan's test; dense spectra almost never need it)

    def split(self, n: int) -> bool:
        """Whether the clusters' Gram-Schmidt shares each panel's projections among many programs per matrix (four
        launches a panel) rather than running one program per matrix."""
        return n >= self.split_n

    def shares(self, n: int) -> tuple[int, int]:
        """(programs a matrix, earlier cluster members a program) of the split Gram-Schmidt's projections: enough
        programs of `earlier` members for a cluster of n."""
        return -(-n // self.earlier), self.earlier

    def unrolled(self, batch: int) -> bool:
        """Whether the Gram-Schmidt's within-panel step runs unrolled (`panel` copies of its code) or as a loop: a
        loop where programs share the SMs (`Tridiagonal.shares_the_sms`): there the unrolled finish, two programs
        an SM by its registers, stalls on instruction fetch; with few matrices the loop gains nothing."""
        return not TRIDIAGONAL.shares_the_sms(batch)

    def vector_panel_warps(self, block_n: int) -> int:
        """Warps per program for the kernels that sweep a matrix's vectors `panel` rows of block_n at a time (the
        one-program Gram-Schmidt and the repair): one per 64 elements of a row, 4 to 16."""
        return min(16, max(4, block_n // 64))

    def finish_warps(self, block_n: int) -> int:
        """Warps of the split Gram-Schmidt's finish (one program a matrix, a chain of row reductions across its
        warps): one per 128 elements of a row, 4 to 16, half of `vector_panel_warps` at 512 and 1024 (faster in the
        Triton port; the Pallas port's finish kernels took the same time either way)."""
        return min(16, max(4, block_n // 128))


@dataclass(frozen=True)
class BackTransform:
    """The back-transformation (compact WY panels, tensor-core products): the fastest, or near it on every row
    tried, of the reflectors, chunks, vectors and warps swept."""

    vectors: int = 64  # eigenvectors a program: the rows of one warp group's products
    reflectors: int = 64  # reflectors a panel: the compact WY form's width
    chunk: int = 32  # columns of Z^T and V^T a product step takes (its K)
    warps: int = 4  # per program, in both of its kernels
    precision: str = "tf32x3"  # three TF32 tensor-core passes, about float32's accuracy ("ieee" products run on CUDA
    # cores, far slower)


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
    """A divide and conquer level's tiles, for merges of `block` rows (`DivideConquer.tiling`)."""

    ranked: int  # other entries a step of the merge-wide kernels (prepare, order), which compare [block, step] tiles
    warps: int  # those kernels' warps
    lanes: int  # roots a program of the secular, z and vector kernels
    chunk: int  # entries a step of those kernels
    tile: int  # the product's tile: rows and columns
    tile_k: int  # the product's tile's K


@dataclass(frozen=True)
class DivideConquer:
    """T's eigenpairs by divide and conquer (the Triton port's candidate): each merge level's secular equation and
    product."""

    secular_steps: int = 40  # bisection steps a root of the divide and conquer's secular equation: within 2^-40 of
    # its half gap, past where the CPU prototype's residual settles (results/h200/experiments/eigh-prototypes/)
    secular_roots: int = 32  # roots (or poles) a program of the divide and conquer's secular, z and vector kernels
    secular_chunk: int = 64  # the other side's entries a step of those kernels' loops
    merge_tile: int = 64  # rows and columns of a merge's new vectors a program of its product
    merge_tile_k: int = 32  # the merge's kept columns a step of that product takes

    def tiling(self, block: int) -> MergeTiling:
        """About 4096 entries a step of the merge-wide kernels, and 8 warps from 512 rows; the product's tiles at
        most half the block, so that a merge of two equal halves has no tile across them, and at least 16 (a
        tensor-core product's least)."""
        return MergeTiling(ranked=max(2, min(self.secular_chunk, 4096 // block)), warps=4 if block <= 256 else 8,
                           lanes=min(self.secular_roots, block), chunk=min(self.secular_chunk, block),
                           tile=max(16, min(self.merge_tile, block // 2)),
                           tile_k=max(16, min(self.merge_tile_k, block)))


JACOBI = Jacobi()
TRIDIAGONAL = Tridiagonal()
BISECTION = Bisection()
INVERSE_ITERATION = InverseIteration()
GRAM_SCHMIDT = GramSchmidt()
BACK_TRANSFORM = BackTransform()
DIVIDE_CONQUER = DivideConquer()
