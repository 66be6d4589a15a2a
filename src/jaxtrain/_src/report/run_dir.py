"""The run directory: config.json, metrics.jsonl and summary.json.

Written the way a database writes its log: metrics rows are appended (flushed every row, fsynced at
every epoch end), JSON files are replaced atomically (`safe_files.atomic_write`), and no write
follows a symbolic link (a run directory whose files are links is refused). A reader drops a torn
or malformed line (a full disk, a power loss, a hand edit) with a note instead of failing.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from jaxtrain._src.errors import ConfigError, argument
from jaxtrain._src.report.notes import note
from jaxtrain._src.safe_files import NOFOLLOW, atomic_write, probe_writable


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def refuse_links(path: Path, names: Iterable[str], who: str = "a run", flag: str | None = None) -> None:
    """Refuses a directory of `who` (a run's, a sweep's) where one of `names` is a symbolic link:
    its writes would land in whatever the link points at.

    Raises:
      ConfigError: naming the link, its target and the setting that chooses the directory (`flag`,
        default the run directory's).
    """
    for name in names:
        if (path / name).is_symlink():
            raise ConfigError(f"{path / name} is a symbolic link (to {os.readlink(path / name)}); {who} writes only "
                              f"its own files: remove the link, or choose another {flag or argument('run_dir')}",
                              run_dir=path)


class RunDir:
    """Writes a run's files. Every JSON file is replaced atomically; metrics are appended."""

    FILES = ("config.json", "metrics.jsonl", "summary.json")

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe_writable(self.path)
        except OSError as e:
            raise self._error(e, "") from None
        refuse_links(self.path, self.FILES)
        self._metrics = self._open_metrics()

    def _error(self, e: OSError, name: str) -> ConfigError:
        where = self.path / name if name else self.path
        return ConfigError(f"cannot write {where}: {e.strerror or e}; free space or {self._advice()}",
                           run_dir=self.path)

    @staticmethod
    def _advice() -> str:
        return f"choose another {argument('run_dir')}"

    def _open_metrics(self) -> Any:
        try:
            fd = os.open(self.path / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o644)
        except OSError as e:
            raise self._error(e, "metrics.jsonl") from None
        return os.fdopen(fd, "a", encoding="utf-8")

    def _replace(self, name: str, text: str) -> None:
        """Replaces `name` with `text` atomically (a new temporary file, synced, renamed over it)."""
        with atomic_write(self.path / name, advice=self._advice()) as f:
            f.write(text.encode("utf-8"))

    def write_json(self, name: str, payload: dict[str, Any]) -> None:
        """Replaces `name` atomically: a new temporary file, synced, renamed over it.

        Raises:
          ConfigError: the file cannot be written (a full or read-only disk, a link in the way).
        """
        self._replace(name, json.dumps(_jsonable(payload), indent=2) + "\n")

    def keep_rows(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Rewrites metrics.jsonl with only the rows `keep` accepts (atomically), then appends from there."""
        rows = [r for r in read_jsonl(self.path / "metrics.jsonl") if keep(r)]
        self._metrics.close()
        self._replace("metrics.jsonl", "".join(json.dumps(_jsonable(r)) + "\n" for r in rows))
        self._metrics = self._open_metrics()

    def log(self, record: dict[str, Any], sync: bool = False) -> None:
        """Appends one row; `sync` also waits until it is on the disk (epoch rows).

        Raises:
          ConfigError: the row cannot be written.
        """
        try:
            self._metrics.write(json.dumps(_jsonable(record)) + "\n")
            self._metrics.flush()
            if sync:
                os.fsync(self._metrics.fileno())
        except OSError as e:
            raise self._error(e, "metrics.jsonl") from None

    def finish(self, summary: dict[str, Any]) -> None:
        """Writes summary.json and closes the metrics file; a full or read-only disk loses only them."""
        try:
            self.write_json("summary.json", summary)
        except ConfigError:
            pass  # the error that stopped the run is what the user needs to see
        self.close()

    def close(self) -> None:
        """Closes the metrics file (`finish` does, after writing summary.json)."""
        try:
            self._metrics.close()
        except OSError:
            pass


def read_jsonl(path: str | os.PathLike, warn: Callable[[str], None] = note) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file; a line that is not a whole JSON object (a row torn by a
    full disk or a crash, a hand edit) is dropped with a note to `warn`."""
    rows, bad = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad.append(number)
    if bad:
        lines = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        warn(f"{path}: line{'s' if len(bad) > 1 else ''} {lines} {'are' if len(bad) > 1 else 'is'} not a whole JSON "
             f"object (torn by a crash or a full disk, or edited); dropped")
    return rows
