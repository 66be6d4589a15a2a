"""The README's newcomer's path, as written: every Python block runs, top to bottom, in one working
directory, with the `$ jaxtrain ...` lines of the shell blocks it builds on.

A marker right before a block (an HTML comment, unseen on GitHub) says how it runs:
`<!-- readme-test: session NAME -->` (it shares its namespace with the other blocks of that session;
a block without one runs in a fresh namespace), `<!-- readme-test: needs MODULE ... -->` (skipped,
and counted as skipped, where a module is not installed), `<!-- readme-test: not run, WHY -->`
(never run: a GPU, many hosts) and, on a shell block, `<!-- readme-test: run the $ lines -->` (each
`$ jaxtrain ...` line runs through the command's `main`). The code runs as printed; the one thing
shrunk is the mlp-regression recipe's default dataset (1,000 + 250 rows instead of 45,000 + 5,000),
so that its `jaxtrain train` lines take a second.
"""

import contextlib
import dataclasses
import importlib.util
import io
import json
import re
import shlex
import traceback
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = re.compile(r"^\s*<!-- readme-test: (.+?) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # "" for none

    @property
    def name(self) -> str:
        return f"README.md:{self.line}"


def read_blocks(text: str) -> list[Block]:
    """Every fenced block of `text` with the marker on the line before it (blank lines between allowed)."""
    blocks, lines, i, marker = [], text.splitlines(), 0, ""
    while i < len(lines):
        found = MARKER.match(lines[i])
        if found:
            marker = found.group(1)
        fence = FENCE.match(lines[i])
        if fence:
            indent, start = len(fence.group(1)), i
            i += 1
            while not re.match(r"^\s*```\s*$", lines[i]):
                i += 1
            body = "\n".join(line[indent:] for line in lines[start + 1 : i])
            blocks.append(Block(start + 1, fence.group(2), body, marker))
            marker = ""
        elif lines[i].strip() and not found:
            marker = ""  # a marker belongs to the block right after it
        i += 1
    return blocks


BLOCKS = read_blocks(README.read_text())
PYTHON = [b for b in BLOCKS if b.lang == "python"]
KNOWN = re.compile(r"session \S+|needs( [\w.]+)+|not run, .+|run the \$ lines")


def shell_lines(block: Block) -> list[list[str]]:
    """The `$ jaxtrain ...` lines of a shell block, as argument lists (comments dropped)."""
    return [shlex.split(line[2:], comments=True) for line in block.code.splitlines() if line.startswith("$ jaxtrain ")]


@dataclasses.dataclass
class Walk:
    cwd: Path  # where the blocks ran
    outcomes: dict[int, object]  # block line -> None (ran), what failed (str), or ("skip", why)


@pytest.fixture(scope="module")
def walk(tmp_path_factory) -> Walk:
    """Runs the README's Python blocks and marked shell lines in order in one working directory."""
    from jaxtrain.tools import recipes
    from jaxtrain.tools.cli import main

    recipe = recipes.get_recipe("mlp-regression")
    data = dataclasses.replace(recipe.config.data, samples=1_000, val_samples=250)
    small = dataclasses.replace(recipe, config=dataclasses.replace(recipe.config, data=data))
    cwd = tmp_path_factory.mktemp("readme")
    outcomes: dict[int, object] = {}
    sessions: dict[str, dict] = {}
    with pytest.MonkeyPatch.context() as m:
        m.chdir(cwd)
        m.setitem(recipes.RECIPES, "mlp-regression", small)
        for block in BLOCKS:
            out = io.StringIO()
            if block.lang == "bash" and block.marker == "run the $ lines":
                failed = []
                for args in shell_lines(block):
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                        code = main(args[1:])
                    if code != 0:
                        failed.append(f"{shlex.join(args)}: exit code {code}\n{out.getvalue()[-3000:]}")
                outcomes[block.line] = "\n".join(failed) or None
            elif block.lang == "python":
                missing = [name for name in block.marker.split()[1:] if block.marker.startswith("needs ")
                           and importlib.util.find_spec(name) is None]
                if block.marker.startswith("not run, ") or missing:
                    outcomes[block.line] = ("skip", block.marker if not missing else f"needs {', '.join(missing)}")
                    continue
                session = block.marker[len("session "):] if block.marker.startswith("session ") else None
                namespace = sessions.setdefault(session, {}) if session else {}
                namespace.setdefault("__name__", "__readme__")
                try:
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                        exec(compile(block.code, block.name, "exec"), namespace)
                except (Exception, SystemExit):  # a block must not end the process either
                    outcomes[block.line] = f"{traceback.format_exc()}\n{out.getvalue()[-3000:]}"
                else:
                    outcomes[block.line] = None
    return Walk(cwd, outcomes)


def test_the_readme_has_its_python_blocks_and_only_known_markers():
    assert len(PYTHON) >= 7
    unknown = [(b.name, b.marker) for b in BLOCKS if b.marker and not KNOWN.fullmatch(b.marker)]
    assert not unknown, f"markers this test does not know: {unknown}"
    assert [b.name for b in BLOCKS if b.lang != "python" and b.marker not in ("", "run the $ lines")] == []


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.name)
def test_each_python_block_runs_as_written(block, walk):
    outcome = walk.outcomes[block.line]
    if isinstance(outcome, tuple):
        pytest.skip(f"{block.name}: {outcome[1]}")
    if outcome is not None:
        pytest.fail(f"{block.name} failed:\n{outcome}", pytrace=False)


def test_the_shell_lines_the_blocks_build_on_run_as_printed(walk):
    marked = [b for b in BLOCKS if b.marker == "run the $ lines"]
    assert marked and all(shell_lines(b) for b in marked)
    for b in marked:
        assert walk.outcomes[b.line] is None, f"{b.name}: {walk.outcomes[b.line]}"


def test_what_the_predict_section_says_of_its_outputs(walk):
    """`yhat.npy` against `y.npy` is the run's best validation loss; the exported forward equals it."""
    cwd = walk.cwd
    yhat, y = np.load(cwd / "yhat.npy"), np.load(cwd / "y.npy")
    summary = json.loads((cwd / "runs" / "mlp" / "summary.json").read_text())
    assert float(np.mean((yhat.astype(np.float64) - y) ** 2)) == pytest.approx(summary["best_val_loss"], rel=1e-6)
    from jax import export

    forward = export.deserialize((cwd / "exported" / "model.jax_export").read_bytes())
    np.testing.assert_allclose(np.asarray(forward.call(np.load(cwd / "x.npy"))), yhat, rtol=1e-5, atol=1e-6)
