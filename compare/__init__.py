"""The comparison driver (`python -m compare`) and its report.

The driver's core: `driver` (cases, variants, checks, the run), `timing` (how a call is timed), `result` (one
implementation's result on one case, the typed record), `records` (what a run records, its floor and summary);
around it `__main__` (the command line), `report` (tables, charts, README), `regression` (`--against`), `suite` (the
test suite run and recorded) and `across_devices` (`--gpus N`). Two subpackages: `invariance` (`python -m compare
invariance`: the batch-invariant modes on a decoder, op by op, on Hugging Face's models and across devices) and
`tools` (the research tools)."""
import os
import textwrap

HELP_COLUMNS = 100  # the width of help text and progress lines


def help_text(doc: str) -> str:
    """A module docstring as a command's --help description: each paragraph and list item ("- ...", its
    continuation lines indented) rewrapped within HELP_COLUMNS; lines indented four spaces (commands) kept."""
    out, words, indent = [], [], ""

    def flush():
        if words:
            out.append(textwrap.fill(" ".join(words), HELP_COLUMNS, subsequent_indent=indent, break_long_words=False,
                                     break_on_hyphens=False))
            words.clear()

    for line in doc.strip().splitlines():
        if not line.strip() or line.startswith("    "):
            flush()
            out.append(line.rstrip())
        elif line.startswith("- "):
            flush()
            indent = "  "
            words.append(line.strip())
        else:
            indent = indent if words and line.startswith("  ") else ""
            words.append(line.strip())
    flush()
    return "\n".join(out)


def gpu_or_interpreters() -> bool:
    """Whether a CUDA GPU is here; without one, the Triton interpreter is chosen (before anything imports triton),
    made fit for the ports (`triton_kernels.interpreter`: pairwise reductions, no warnings from masked lanes)."""
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from triton_kernels.interpreter import prepare_interpreter

        prepare_interpreter()
    return on_gpu
