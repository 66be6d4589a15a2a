"""`jaxtrain bench scan-corpus`: precision and recall of `jaxtrain scan` on hand-labelled code by others.

The corpus file (docs/scan_corpus.json) lists public training scripts by repository, commit and
path, with hand labels: `anti` ([line, rule] of each anti-pattern judged present) and `clean`
(lines where no high or medium finding may land). The scripts themselves are not in this
repository: they are read from a cache directory laid out as CACHE/OWNER/NAME/PATH, which the
user fills once (the command prints the `git` lines that do it when files are missing). Entries
with `local` instead are scripts of this repository (benchmarks/scan_variants/), written in the
style of the public script their `modelled_on` names; their labels are `# scan: RULE` and
`# scan: clean` comments on the lines (`labels`).

Per rule: recall = labelled anti-patterns with a finding of that rule on that line / labelled;
precision = findings of that rule on a labelled line of that rule / findings of that rule (any
severity). Clean violations: high or medium findings on a line labelled clean.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from pathlib import Path

from jaxtrain._src.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ScanCorpusConfig:
    """Settings of the scan-corpus benchmark."""

    corpus: str = "docs/scan_corpus.json"
    """The labelled corpus (JSON)."""
    cache: str = ""
    """Directory holding the fetched files as OWNER/NAME/PATH; default $JAXTRAIN_SCAN_CORPUS or
    ~/.cache/jaxtrain/scan_corpus."""
    json_out: bool = False
    """Print the figures as JSON instead of a table."""


def cache_dir(config: ScanCorpusConfig) -> Path:
    return Path(config.cache or os.environ.get("JAXTRAIN_SCAN_CORPUS") or
                Path.home() / ".cache" / "jaxtrain" / "scan_corpus")


def fetch_lines(entries: list[dict], cache: Path) -> list[str]:
    """Shell lines that put each entry at CACHE/OWNER/NAME/PATH (git, a shallow fetch of the commit)."""
    lines, repos = [], {}
    for e in entries:
        if "local" not in e:
            repos.setdefault((e["repo"], e["commit"]), []).append(e["path"])
    for (repo, commit), paths in repos.items():
        tmp = f"/tmp/scan_corpus_{repo.replace('/', '+')}"
        lines.append(f"git init -q {tmp} && git -C {tmp} fetch -q --depth 1 https://github.com/{repo} {commit}")
        for p in paths:
            dest = cache / repo / p
            lines.append(f"mkdir -p {shlex.quote(str(dest.parent))} && git -C {tmp} show "
                         f"{commit}:{shlex.quote(p)} > {shlex.quote(str(dest))}")
    return lines


MARKER = re.compile(r"#\s*scan:\s*([\w-]+)")


def labels(source: str) -> tuple[list[list], list[int]]:
    """`(anti, clean)` from a variant's `# scan: RULE` / `# scan: clean` comments."""
    anti, clean = [], []
    for number, line in enumerate(source.splitlines(), 1):
        if match := MARKER.search(line):
            if match.group(1) == "clean":
                clean.append(number)
            else:
                anti.append([number, match.group(1)])
    return anti, clean


def _file(entry: dict, cache: Path, root: Path) -> Path:
    return root / entry["local"] if "local" in entry else cache / entry["repo"] / entry["path"]


def _name(entry: dict) -> str:
    return entry["local"] if "local" in entry else f"{entry['repo']}/{entry['path']}"


def measure(corpus: dict, cache: Path, root: Path = Path(".")) -> dict:
    """Per-rule counts and the clean-line violations; raises ConfigError if a file is missing.
    `root`: the repository the `local` entries' paths start from."""
    from jaxtrain.tools.diagnose.scan import scan_source

    entries = corpus["files"]
    missing = [e for e in entries if "local" not in e and not (cache / e["repo"] / e["path"]).is_file()]
    if missing:
        raise ConfigError(f"{len(missing)} of {len(entries)} corpus files are not in {cache}; nothing measured. "
                          "Fill the cache (needs network and git) with:\n" + "\n".join(fetch_lines(missing, cache)))
    rules = corpus["rules"]
    stats = {r: {"labelled": 0, "found": 0, "findings": 0, "true": 0} for r in rules}
    violations, misses, false_positives, clean_lines = [], [], [], 0
    for e in entries:
        name, source = _name(e), _file(e, cache, root).read_text(encoding="utf-8")
        findings = scan_source(source, name)
        anti_labels, clean = labels(source) if "local" in e else (e["anti"], e["clean"])
        anti = {(line, rule) for line, rule in anti_labels}
        clean_lines += len(clean)
        for line, rule in sorted(anti):
            stats[rule]["labelled"] += 1
            if any(f.line == line and f.rule == rule for f in findings):
                stats[rule]["found"] += 1
            else:
                misses.append(f"{name}:{line} {rule}")
        for f in findings:
            if f.rule not in stats:
                continue
            stats[f.rule]["findings"] += 1
            if (f.line, f.rule) in anti:
                stats[f.rule]["true"] += 1
            else:
                false_positives.append(f"{name}:{f.line} {f.rule} ({f.severity})")
            if f.line in clean and f.severity in ("high", "medium"):
                violations.append(f"{name}:{f.line} {f.rule} ({f.severity})")
    labelled = sum(s["labelled"] for s in stats.values())
    found = sum(s["found"] for s in stats.values())
    return {"files": len(entries), "labelled": labelled, "found": found,
            "clean_lines": clean_lines, "rules": stats, "misses": misses,
            "false_positives": false_positives, "clean_violations": violations,
            "recall": found / labelled if labelled else 1.0}


def main(config: ScanCorpusConfig) -> int:
    path = Path(config.corpus)
    if not path.is_file():
        raise ConfigError(f"{path}: no such corpus file; give --corpus docs/scan_corpus.json")
    corpus = json.loads(path.read_text(encoding="utf-8"))
    result = measure(corpus, cache_dir(config), root=path.resolve().parent.parent)  # docs/ -> the repository
    if config.json_out:
        print(json.dumps(result, indent=1))
        return 0

    def pct(a: int, b: int) -> str:
        return f"{a}/{b} ({100 * a / b:.0f}%)" if b else "-"

    print(f"{result['files']} files, {result['labelled']} labelled anti-patterns, {result['clean_lines']} clean lines")
    print(f"{'rule':20s} {'recall':>14s} {'precision':>14s}")
    for rule, s in result["rules"].items():
        print(f"{rule:20s} {pct(s['found'], s['labelled']):>14s} {pct(s['true'], s['findings']):>14s}")
    print(f"{'all':20s} {pct(result['found'], result['labelled']):>14s}")
    for title, key in (("missed", "misses"), ("unlabelled findings", "false_positives"),
                       ("high/medium on clean lines", "clean_violations")):
        print(f"{title}: {len(result[key])}")
        for item in result[key]:
            print(f"  {item}")
    return 0
