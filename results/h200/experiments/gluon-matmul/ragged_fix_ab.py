"""The Gluon matmul's failure at 128 x 256 tiles where K's steps are not a multiple of the ring's stages
(ragged_failure.py, removed: `git show b2d8018dc320:results/h200/experiments/gluon-matmul/
ragged_failure.py`), and its fix: the module as it is (a CTA barrier before the output tile's shared memory is
written, `store_tile`), against copies of it without that barrier, and without it with 3 stages for 128 x 256
tiles (the ring and the output tile then fit side by side). Each shape's relative Frobenius error against a float32
torch matmul over five calls, whether each copy's bits equal the module's, and do_bench times.

    PYTHONPATH=. python results/h200/experiments/gluon-matmul/ragged_fix_ab.py   (on a GPU)
"""
import importlib.util
import pathlib
import sys
import tempfile

import torch

SHAPES = [(3000, 5120, 2880), (3000, 5120, 2944), (3000, 5120, 3008), (4096, 5120, 2880), (3000, 5120, 4096),
          (2048, 128, 2880)]
SOURCE = pathlib.Path("gluon_kernels/matmul.py").read_text()
UNFENCED = SOURCE.replace("    cta_barrier()\n    c_smem = gl.allocate_shared_memory(", "    c_smem = gl.allocate_shared_memory(", 1)
VARIANTS = {
    "as it is": SOURCE,
    "no barrier": UNFENCED,
    "no barrier, 3 stages": UNFENCED.replace(
        "wanted = MAX_STAGES if tiles.tile_m == 64 else 4",
        "wanted = MAX_STAGES if tiles.tile_m == 64 else (3 if tiles.tile_n == 256 else 4)", 1),
}


def load(name, text):
    path = pathlib.Path(tempfile.mkdtemp()) / f"gluon_matmul_{name.replace(' ', '_')}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def main():
    assert len({*VARIANTS.values()}) == len(VARIANTS), "a change found no place"
    modules = {name: load(name, text) for name, text in VARIANTS.items()}
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'M x N x K':>20} " + " ".join(f"{name:>22}" for name in modules))
    for m, n, k in SHAPES:
        a = torch.randn((m, k), device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn((k, n), device="cuda", generator=gen).to(torch.bfloat16)
        ref = a.float() @ b.float()
        cells, outputs = [], []
        for module in modules.values():
            errors = []
            for _ in range(5):
                c = module.matmul((a, b, "same"))
                torch.cuda.synchronize()
                errors.append((torch.linalg.norm(c.float() - ref) / torch.linalg.norm(ref)).item())
            outputs.append(c)
            cells.append(f"{min(errors):.2g}..{max(errors):.2g}")
        same = [torch.equal(outputs[0], c) for c in outputs[1:]]
        print(f"{m:>6} x {n:>5} x {k:>5} " + " ".join(f"{cell:>22}" for cell in cells) + f"  bits equal to the module's: {same}")
    for name, module in modules.items():  # time each at the failing shape and at a passing one (kernel + host)
        for m, n, k in ((3000, 5120, 2880), (4096, 5120, 4096)):
            a = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
            b = torch.randn((k, n), device="cuda", dtype=torch.bfloat16)
            import triton.testing
            ms = triton.testing.do_bench(lambda: module.matmul((a, b, "same")))
            print(f"{name:>10} {m} x {n} x {k}: {ms * 1e3:.1f} us (do_bench)")


if __name__ == "__main__":
    main()
