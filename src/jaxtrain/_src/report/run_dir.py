"""The run directory: config.json, metrics.jsonl and summary.json."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from jaxtrain._src.errors import ConfigError, argument


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class RunDir:
    """Writes a run's files. Every JSON file is replaced atomically; metrics are appended."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            message = f"cannot write to run directory {self.path}: {e.strerror}; choose another {argument('run_dir')}"
            raise ConfigError(message, run_dir=self.path) from None
        self._metrics = open(self.path / "metrics.jsonl", "a", encoding="utf-8")

    def write_json(self, name: str, payload: dict[str, Any]) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(_jsonable(payload), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.path / name)

    def keep_rows(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Rewrites metrics.jsonl with only the rows `keep` accepts (atomically), then appends from there."""
        rows = [r for r in read_jsonl(self.path / "metrics.jsonl") if keep(r)]
        self._metrics.close()
        tmp = self.path / ".metrics.jsonl.tmp"
        tmp.write_text("".join(json.dumps(_jsonable(r)) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, self.path / "metrics.jsonl")
        self._metrics = open(self.path / "metrics.jsonl", "a", encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        try:
            self._metrics.write(json.dumps(_jsonable(record)) + "\n")
            self._metrics.flush()
        except OSError as e:
            raise ConfigError(f"cannot write {self.path / 'metrics.jsonl'}: {e.strerror}; free space or choose "
                              f"another {argument('run_dir')}", run_dir=self.path) from None

    def finish(self, summary: dict[str, Any]) -> None:
        """Writes summary.json and closes the metrics file; a full or read-only disk loses only them."""
        try:
            self.write_json("summary.json", summary)
        except OSError:
            pass  # the error that stopped the run is what the user needs to see
        try:
            self._metrics.close()
        except OSError:
            pass


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
