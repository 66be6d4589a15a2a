"""The run directory's files: config.json at the start, metrics.jsonl rows (training rows every
`log_every` steps, one per epoch), summary.json at the end.

On resume, metrics.jsonl is cut back to the rows of steps up to the checkpoint: rows a killed run
wrote after its last checkpoint are written again by the resumed run, so the log holds the rows of
an uninterrupted run (timings aside) and the curves draw each step once.

The loop places this hook before the checkpoints, so an epoch's row is on the disk (fsynced) before
that epoch's checkpoint starts: a checkpoint never gets ahead of the log. Its summary is written
last of all hooks' `on_end` (the loop's `_end`), once every hook has added to it.
"""

from __future__ import annotations

import os
from typing import Any

from jaxtrain._src.errors import ConfigError
from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.report.run_dir import RunDir


class RunFilesHook(RunHook):
    def __init__(self, path: str | os.PathLike, config: dict[str, Any]):
        self._path, self._config = path, config
        self.writer: RunDir | None = None

    def on_start(self, run: Run) -> None:
        self.writer = RunDir(self._path)
        if run.resumed_step is not None:
            self.writer.keep_rows(lambda row: row.get("step", 0) <= run.resumed_step)
        self.writer.write_json("config.json", self._config)

    def _started(self) -> RunDir:
        assert self.writer is not None  # made in on_start
        return self.writer

    def on_log(self, run: Run, row: dict[str, Any]) -> None:
        self._started().log(row)

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        self._started().log({"kind": "epoch", **record, "elapsed_s": run.elapsed_s}, sync=True)

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        if self.writer is None:  # stopped before on_start (a signal while compiling): write the status
            try:
                self.writer = RunDir(self._path)
            except ConfigError:
                return
        self.writer.finish(summary)
