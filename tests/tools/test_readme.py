"""The README and the guides (docs/guide/*.md), as written: every Python block runs, top to bottom, one
working directory per file, with the `$ jaxtrain ...` lines of the shell blocks it builds on; and the
documents keep to their limits (README <= 400 lines, docs/benchmarks.md <= 800) and their relative links
resolve (the file, and the heading an anchor names).

A marker right before a block (an HTML comment, unseen on GitHub) says how it runs:
`<!-- readme-test: session NAME -->` (it shares its namespace with the other blocks of that session in
the same file; a block without one runs in a fresh namespace), `<!-- readme-test: needs MODULE ... -->`
(skipped, and counted as skipped, where a module is not installed), `<!-- readme-test: not run, WHY -->`
(never run: a GPU, many hosts) and, on a shell block, `<!-- readme-test: run the $ lines -->` (each
`$ jaxtrain ...` line runs through the command's `main`). The code runs as printed; the one thing
shrunk is the mlp-regression recipe's default dataset (1,000 + 250 rows instead of 45,000 + 5,000),
so that its `jaxtrain train` lines take a second. Blocks that train use tiny sizes of their own.
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

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))
DOCS = [README, *GUIDES]
MARKER = re.compile(r"^\s*<!-- readme-test: (.+?) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    doc: str  # the file, relative to the repository
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # "" for none

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def read_blocks(text: str, doc: str = "README.md") -> list[Block]:
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
            blocks.append(Block(doc, start + 1, fence.group(2), body, marker))
            marker = ""
        elif lines[i].strip() and not found:
            marker = ""  # a marker belongs to the block right after it
        i += 1
    return blocks


BLOCKS = [b for path in DOCS for b in read_blocks(path.read_text(), str(path.relative_to(ROOT)))]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
KNOWN = re.compile(r"session \S+|needs( [\w.]+)+|not run, .+|run the \$ lines")


def shell_lines(block: Block) -> list[list[str]]:
    """The `$ jaxtrain ...` lines of a shell block, as argument lists (comments dropped)."""
    return [shlex.split(line[2:], comments=True) for line in block.code.splitlines() if line.startswith("$ jaxtrain ")]


@dataclasses.dataclass
class Walk:
    cwds: dict[str, Path]  # file -> where its blocks ran
    outcomes: dict[str, object]  # block name -> None (ran), what failed (str), or ("skip", why)


@pytest.fixture(scope="module")
def walk(tmp_path_factory) -> Walk:
    """Runs each file's Python blocks and marked shell lines in order, in one working directory per file."""
    from jaxtrain.tools import recipes
    from jaxtrain.tools.cli import main

    recipe = recipes.get_recipe("mlp-regression")
    data = dataclasses.replace(recipe.config.data, samples=1_000, val_samples=250)
    small = dataclasses.replace(recipe, config=dataclasses.replace(recipe.config, data=data))
    cwds: dict[str, Path] = {}
    outcomes: dict[str, object] = {}
    sessions: dict[tuple[str, str], dict] = {}
    with pytest.MonkeyPatch.context() as m:
        m.setitem(recipes.RECIPES, "mlp-regression", small)
        for block in BLOCKS:
            if block.doc not in cwds:
                cwds[block.doc] = tmp_path_factory.mktemp(Path(block.doc).stem)
                m.chdir(cwds[block.doc])
            out = io.StringIO()
            if block.lang == "bash" and block.marker == "run the $ lines":
                failed = []
                for args in shell_lines(block):
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                        code = main(args[1:])
                    if code != 0:
                        failed.append(f"{shlex.join(args)}: exit code {code}\n{out.getvalue()[-3000:]}")
                outcomes[block.name] = "\n".join(failed) or None
            elif block.lang == "python":
                missing = [name for name in block.marker.split()[1:] if block.marker.startswith("needs ")
                           and importlib.util.find_spec(name) is None]
                if block.marker.startswith("not run, ") or missing:
                    outcomes[block.name] = ("skip", block.marker if not missing else f"needs {', '.join(missing)}")
                    continue
                session = block.marker[len("session "):] if block.marker.startswith("session ") else None
                namespace = sessions.setdefault((block.doc, session), {}) if session else {}
                namespace.setdefault("__name__", "__readme__")
                try:
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                        exec(compile(block.code, block.name, "exec"), namespace)
                except (Exception, SystemExit):  # a block must not end the process either
                    outcomes[block.name] = f"{traceback.format_exc()}\n{out.getvalue()[-3000:]}"
                else:
                    outcomes[block.name] = None
    return Walk(cwds, outcomes)


def test_the_docs_have_their_python_blocks_and_only_known_markers():
    assert [b for b in PYTHON if b.doc == "README.md"], "the README's example is a Python block"
    assert len(PYTHON) >= 12 and len({b.doc for b in PYTHON}) >= 6
    unknown = [(b.name, b.marker) for b in BLOCKS if b.marker and not KNOWN.fullmatch(b.marker)]
    assert not unknown, f"markers this test does not know: {unknown}"
    assert [b.name for b in BLOCKS if b.lang != "python" and b.marker not in ("", "run the $ lines")] == []


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.name)
def test_each_python_block_runs_as_written(block, walk):
    outcome = walk.outcomes[block.name]
    if isinstance(outcome, tuple):
        pytest.skip(f"{block.name}: {outcome[1]}")
    if outcome is not None:
        pytest.fail(f"{block.name} failed:\n{outcome}", pytrace=False)


def test_the_shell_lines_the_blocks_build_on_run_as_printed(walk):
    marked = [b for b in BLOCKS if b.marker == "run the $ lines"]
    assert marked and all(shell_lines(b) for b in marked)
    for b in marked:
        assert walk.outcomes[b.name] is None, f"{b.name}: {walk.outcomes[b.name]}"


def test_what_the_predict_section_says_of_its_outputs(walk):
    """`yhat.npy` against `y.npy` is the run's best validation loss; the exported forward equals it."""
    cwd = walk.cwds["docs/guide/trained-model.md"]
    yhat, y = np.load(cwd / "yhat.npy"), np.load(cwd / "y.npy")
    summary = json.loads((cwd / "runs" / "mlp" / "summary.json").read_text())
    assert float(np.mean((yhat.astype(np.float64) - y) ** 2)) == pytest.approx(summary["best_val_loss"], rel=1e-6)
    from jax import export

    forward = export.deserialize((cwd / "exported" / "model.jax_export").read_bytes())
    np.testing.assert_allclose(np.asarray(forward.call(np.load(cwd / "x.npy"))), yhat, rtol=1e-5, atol=1e-6)


# The limits the README and the benchmarks keep: a map and a reference, not a diary.
LIMITS = {"README.md": 400, "docs/benchmarks.md": 800}


@pytest.mark.parametrize("doc", sorted(LIMITS))
def test_the_documents_keep_to_their_length(doc):
    lines = len((ROOT / doc).read_text().splitlines())
    assert lines <= LIMITS[doc], f"{doc} has {lines} lines, over its {LIMITS[doc]}: move the detail to a guide"


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def without_code(text: str) -> str:
    """`text` with its fenced blocks and inline code spans blanked (a `#` or `[x](y)` there is code, not markdown)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if re.match(r"^\s*```", line):
            fenced = not fenced
            kept.append("")
        else:
            kept.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return "\n".join(kept)


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of `text`: lower case, punctuation dropped, spaces to hyphens,
    a repeated heading numbered (-1, -2, ...)."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if re.match(r"^\s*```", line):
            fenced = not fenced
            continue
        heading = HEADING.match(line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).replace("`", "").lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file is missing, or whose anchor names no heading there."""
    broken = []
    for target in LINK.findall(without_code(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            broken.append(f"{target}: no heading of {resolved.name} has the anchor #{anchor}")
    return broken


@pytest.mark.parametrize("doc", [*DOCS, ROOT / "docs" / "benchmarks.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    assert not broken_links(doc), f"{doc.relative_to(ROOT)}: broken links: {broken_links(doc)}"


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## What `fit` does\n\n```bash\n# not a heading\n```\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[a](other.md#what-fit-does) [b](other.md#not-a-heading) [c](gone.md) [d](https://x.org/y)\n"
                   "`[e](also-gone.md)` [f](#here)\n\n## Here\n")
    assert broken_links(doc) == ["other.md#not-a-heading: no heading of other.md has the anchor #not-a-heading",
                                 "gone.md: no such file"]
