"""House rules, checked on the source: no import circle among the project's modules, no source file over 600 lines,
no name used undefined, and no timing quoted in the comments and docstrings of the kernels, the ports and the
driver (measurements live in results/, with the command that made them)."""
import ast
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("ports", "kernel_support", "batch_invariant", "triton_kernels", "pallas_kernels", "gluon_kernels",
            "mosaic_gpu_kernels", "compare")
SOURCES = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
TIMING = re.compile(r"\b\d+(\.\d+)? ?(ms|us|µs)\b|\bTFLOP/s\b.*\d|\d.*\bTFLOP/s\b")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The project modules that a module imports at its top level (imports inside functions run later, and a
    circle through them is not one at import time), leaving out its own packages, which Python imports first."""
    name, found = module_name(path), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in modules and module != name and not name.startswith(f"{module}.")}


def import_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of modules in {module: the modules it imports}, as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path + [module, target]
            if target not in state and (circle := visit(target, path + [module])):
                return circle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module, [])):
            return circle
    return None


def test_no_import_circle():
    modules = {module_name(path) for path in SOURCES}
    circle = import_circle({module_name(path): imported_modules(path, modules) for path in SOURCES})
    assert circle is None, f"import circle: {' -> '.join(circle)}"


def test_no_source_file_over_600_lines():
    files = SOURCES + sorted((ROOT / "tests").glob("*.py"))
    long = {str(path.relative_to(ROOT)): count for path in files
            if (count := len(path.read_text().splitlines())) > 600}
    assert not long, long


def test_no_line_over_120_columns():
    files = SOURCES + sorted((ROOT / "tests").glob("*.py"))
    long = [f"{path.relative_to(ROOT)}:{number}" for path in files
            for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 120]
    assert not long, long


def undefined_names(path: pathlib.Path) -> list[str]:
    """pyflakes' undefined names in a module: a name that a GPU-only path uses unimported fails only on a GPU (the
    driver's `context_lost` once did); this finds it on any machine."""
    checker = pytest.importorskip("pyflakes.checker")
    from pyflakes import messages

    found = checker.Checker(ast.parse(path.read_text()), str(path)).messages
    undefined = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
    return [f"{path.name}:{m.lineno}: {m.message % m.message_args}" for m in found if isinstance(m, undefined)]


def test_no_name_is_used_undefined():
    files = SOURCES + sorted((ROOT / "tests").glob("*.py"))
    assert not [line for path in files for line in undefined_names(path)]


def comments_and_docstrings(path: pathlib.Path):
    """(line, text) of every comment and docstring of a module."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield node.body[0].lineno, docstring


def test_no_timing_in_code_comments_or_docstrings():
    quoted = [f"{path.relative_to(ROOT)}:{line}: {match.group(0)}" for path in SOURCES
              for line, text in comments_and_docstrings(path) for match in [TIMING.search(text)] if match]
    assert not quoted, "\n".join(quoted)


def test_the_house_rules_catch_what_they_are_for(tmp_path):
    # each rule fails on a planted case: a timing in a comment and in a docstring, a circle of two modules
    planted = tmp_path / "planted.py"
    planted.write_text('"""Runs in 1.5 ms."""\nX = 1  # 0.25 ms on the GPU\n')
    assert [text for _, text in comments_and_docstrings(planted) if TIMING.search(text)] == [
        "# 0.25 ms on the GPU", "Runs in 1.5 ms."]
    planted.write_text("def synchronise():\n    import os\n\n    return torch.cuda.synchronize(os)\n")
    assert undefined_names(planted) == ["planted.py:4: undefined name 'torch'"]
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("from a import x\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        graph = {name: imported_modules(tmp_path / f"{name}.py", {"a", "b"}) for name in ("a", "b")}
    finally:
        ROOT = saved
    assert graph == {"a": {"b"}, "b": {"a"}} and import_circle(graph) == ["a", "b", "a"]
    assert import_circle({"a": {"b"}, "b": set()}) is None
