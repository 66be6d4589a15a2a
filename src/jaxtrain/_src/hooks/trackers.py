"""Experiment trackers: MLflow, Weights & Biases and CSV, beside TensorBoard.

Each tracker records the run's config as parameters (nested keys joined by dots), every training
row (`log_every` steps) and every epoch record as metrics with the optimizer step as x-axis, and
at the end the summary's numbers, summary.json, config.json, metrics.jsonl and curves.png as
artifacts. A resumed run continues the tracked run its interrupted predecessor started (the ids
are kept in the run directory's trackers.json), so one training run is one tracked run. Rows the
predecessor logged after its last checkpoint are logged again by the resumed run (MLflow and W&B
keep both values of such a step; metrics.jsonl and metrics.csv keep the resumed run's).

The packages are optional (the "track" extra); a missing one is one line naming it (`extras.require`).
MLflow follows its own environment (`MLFLOW_TRACKING_URI`, default ./mlruns); W&B its own
(`WANDB_MODE=offline`, `WANDB_PROJECT`, ...).

A tracker is a side channel: one that cannot start or fails mid-run (a server that stops
answering, a full disk) is turned off with one note on stderr, and the run goes on, its own files
whole. MLflow's HTTP calls are bounded meanwhile (`MLFLOW_HTTP_BOUNDS`, unless the environment sets
them), so a dead server costs seconds, not MLflow's minutes of retries; W&B's start waits at most
`WandB.init_timeout` (20 s, unless `WANDB_INIT_TIMEOUT` is set), not its default 90 s.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from jaxtrain._src.config import flat_dict, to_dict
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.extras import require
from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.report.notes import note
from jaxtrain._src.safe_files import write_text

if TYPE_CHECKING:  # an optional package, imported when the tracker starts
    from mlflow.tracking import MlflowClient

IDS = "trackers.json"  # {tracker name: the tracked run's id}, in the run directory
ARTIFACTS = ("summary.json", "config.json", "metrics.jsonl", "curves.png", "model.json", "predict.json")
_NOT_METRICS = ("kind", "epoch", "step", "elapsed_s")


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a row, without its step and labels."""
    return {k: float(v) for k, v in row.items() if k not in _NOT_METRICS and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def _epoch_metrics(record: dict[str, Any]) -> dict[str, float]:
    """An epoch record's figures, named as TensorBoard names them (epoch/..., val/...)."""
    out = {}
    for name, value in _numbers(record).items():
        if name.startswith("val_"):
            out[f"val/{name[4:]}"] = value
        elif name.startswith("train_") and not name.endswith("_s"):
            out[f"epoch/{name}"] = value
        elif name == "epoch_time_s":
            out["epoch/time_s"] = value
    return out


def reason(e: BaseException) -> str:
    """Why a call failed, in one short line: the root cause of a chain when it is an OS error
    (`ConnectionRefusedError: [Errno 111] Connection refused` rather than the HTTP library's
    paragraph about retries), else the error's own first line."""
    root = e
    while (parent := root.__cause__ or root.__context__) is not None:
        root = parent
    shown = root if root is not e and isinstance(root, OSError) else e
    first = (str(shown).strip().splitlines() or [""])[0][:300]
    return f"{type(shown).__name__}: {first}" if first else type(shown).__name__


def side_channel(method: Callable[..., None]) -> Callable[..., None]:
    """An event of a `SideChannel` (a tracker, TensorBoard), which must never stop training: an
    error (not the ConfigError of a missing package) turns it off with one note naming it, the
    error and what to check; its later events are skipped. Calls run inside its `bounds()`."""

    @functools.wraps(method)
    def wrapped(self: Any, run: Run, *args: Any) -> None:
        if self.off:
            return
        try:
            with self.bounds():
                method(self, run, *args)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - a side channel's failure, said in one line
            self.off = True
            when = "could not start" if method.__name__ == "on_start" else (
                f"failed at step {run.step:,}" + (" uploading the run files" if method.__name__ == "after_files"
                                                  else ""))
            note(f"{self.label} {when} ({reason(e)}); it is off for the rest of this run, which goes on "
                 f"(check {self.advice()})")

    return wrapped


# MLflow's HTTP settings for the trackers' calls, where the environment does not set them: a
# connection refused fails in 2-3 s (3 tries) and a server that hangs in about 18 s, where
# MLflow's defaults (7 retries, backoff 2, 120 s timeout) retried a dead server for minutes.
MLFLOW_HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                      "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


@contextlib.contextmanager
def _bounded_http() -> Iterator[None]:
    """MLflow's calls inside the block retry briefly (`MLFLOW_HTTP_BOUNDS`, for the variables the
    user did not set), and urllib3 does not print a warning per retry; both as before after it."""
    added = {k: v for k, v in MLFLOW_HTTP_BOUNDS.items() if k not in os.environ}
    urllib3 = logging.getLogger("urllib3.connectionpool")
    level = urllib3.level
    os.environ.update(added)
    urllib3.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)
        urllib3.setLevel(level)


class SideChannel(RunHook):
    """A hook whose failure must never stop training (the trackers, TensorBoard): its events are
    `side_channel`s, and one that fails turns it `off` with one note naming its `label` and what to
    check (`advice`)."""

    off = False  # set when it failed: its later events are skipped

    @property
    def label(self) -> str:
        """Its name in the note (a subclass may set a plain class attribute instead)."""
        return "a side channel"

    def advice(self) -> str:
        """What to check when it failed."""
        return "its settings"

    def bounds(self) -> contextlib.AbstractContextManager:
        """What its calls run inside (MLflow: bounded HTTP retries)."""
        return contextlib.nullcontext()


class Tracker(SideChannel):
    """What every tracker shares: the ids of resumed runs, the config, the artifacts, and being
    turned off when it fails (`SideChannel`)."""

    name_in_ids = "tracker"

    @property
    def label(self) -> str:
        return f"the {self.name_in_ids} tracker"

    def advice(self) -> str:
        return "its settings, or drop it from the trackers"

    def _saved_id(self, run: Run) -> str | None:
        path = run.run_dir / IDS if run.run_dir is not None else None
        if run.resumed_step is None or path is None or not path.is_file():
            return None
        return json.loads(path.read_text()).get(self.name_in_ids)

    def _save_id(self, run: Run, run_id: str) -> None:
        if run.run_dir is None:
            return
        path = run.run_dir / IDS
        ids = json.loads(path.read_text()) if path.is_file() else {}
        ids[self.name_in_ids] = run_id
        write_text(path, json.dumps(ids, indent=2) + "\n")

    @staticmethod
    def _config(run: Run) -> dict[str, Any]:
        return {"recipe": run.name, **flat_dict(to_dict(run.config))}

    @staticmethod
    def _artifacts(run: Run) -> list[Path]:
        if run.run_dir is None:
            return []
        return [run.run_dir / name for name in ARTIFACTS if (run.run_dir / name).is_file()]


class MLflow(Tracker):
    """Tracks the run in MLflow: a run created in `experiment` (its id kept for a resume),
    the config as parameters, metrics with the step, the summary's numbers, the run files as
    artifacts.

    Args:
      tracking_uri: the MLflow server or store (default MLflow's: `MLFLOW_TRACKING_URI`, ./mlruns).
      experiment: the experiment's name (created when absent).
      run_name: the tracked run's name (default the run directory's name).
    """

    name_in_ids = "mlflow"

    def __init__(self, tracking_uri: str | None = None, experiment: str = "jaxtrain", run_name: str | None = None):
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self._client: MlflowClient | None = None
        self._run_id: str | None = None  # both set once on_start succeeds
        self._status = "FINISHED"

    def advice(self) -> str:
        where = getattr(self._client, "tracking_uri", None) or self.tracking_uri
        if not where:
            return "MLFLOW_TRACKING_URI, or drop mlflow from the trackers"
        what = f"that the MLflow server at {where} answers" if where.startswith("http") else f"the MLflow store {where}"
        return f"{what}, or drop mlflow from the trackers"

    def bounds(self) -> contextlib.AbstractContextManager:
        return _bounded_http()

    @side_channel
    def on_start(self, run: Run) -> None:
        mlflow = require("mlflow", "the mlflow tracker")
        from mlflow.tracking import MlflowClient

        client = self._client = MlflowClient(tracking_uri=self.tracking_uri)
        run_id = self._run_id = self._saved_id(run)
        if run_id is None:
            found = client.get_experiment_by_name(self.experiment)
            experiment_id = found.experiment_id if found else client.create_experiment(self.experiment)
            name = self.run_name or (run.run_dir.name if run.run_dir is not None else run.name)
            run_id = self._run_id = client.create_run(experiment_id, run_name=name).info.run_id
            self._save_id(run, run_id)
            params = [mlflow.entities.Param(k, (v if isinstance(v, str) else json.dumps(v))[:500])
                      for k, v in self._config(run).items()]
            for i in range(0, len(params), 100):
                client.log_batch(run_id, params=params[i: i + 100])
        else:
            client.update_run(run_id, status="RUNNING")

    def _started(self) -> tuple[MlflowClient, str]:
        """The client and the tracked run's id (later events run only after on_start succeeded)."""
        assert self._client is not None and self._run_id is not None
        return self._client, self._run_id

    def _log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k.replace("/", "."), v, now, step) for k, v in metrics.items()]
        client, run_id = self._started()
        for i in range(0, len(batch), 500):
            client.log_batch(run_id, metrics=batch[i: i + 500])

    @side_channel
    def on_log(self, run: Run, row: dict[str, Any]) -> None:
        self._log({f"train.{k}": v for k, v in _numbers(row).items()}, row["step"])

    @side_channel
    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        self._log(_epoch_metrics(record), record["step"])

    @side_channel
    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        if self._client is None:
            return
        numbers = {f"summary.{k}": v for k, v in _numbers(summary).items()}
        self._log(numbers, summary.get("steps", 0))
        status = summary.get("status", "")
        client, run_id = self._started()
        client.set_tag(run_id, "jaxtrain.status", status)
        self._status = ("FINISHED" if status in ("completed", "stopped early") else
                        "KILLED" if "signal" in status else "FAILED")

    @side_channel
    def after_files(self, run: Run) -> None:
        """The run files as artifacts; the tracked run ends (called once summary.json is written)."""
        if self._client is not None:
            client, run_id = self._started()
            for path in self._artifacts(run):
                client.log_artifact(run_id, str(path))
            with contextlib.redirect_stdout(io.StringIO()):  # MLflow prints links to stdout
                client.set_terminated(run_id, self._status)


WANDB_INIT_TIMEOUT_S = 20.0  # `WandB`'s bound on `wandb.init`: see its docstring


class WandB(Tracker):
    """Tracks the run in Weights & Biases: `wandb.init` with the config (resumed by id), metrics with
    the step, the summary in the run's summary, the run files saved with it.

    Args:
      project: the W&B project.
      mode: "online", "offline" (files under the run directory's wandb/, synced later with
        `wandb sync`) or None for W&B's own setting (`WANDB_MODE`).
      init_timeout: seconds `wandb.init` may wait for the server before the tracker is turned off
        (20 s: a healthy server answers in a few; W&B's default, 90 s, held an unreachable server's
        run that long before its first step); a `WANDB_INIT_TIMEOUT` in the environment is kept;
        None: W&B's own setting.
    """

    name_in_ids = "wandb"

    def __init__(self, project: str = "jaxtrain", mode: str | None = None,
                 init_timeout: float | None = WANDB_INIT_TIMEOUT_S):
        self.project, self.mode, self.init_timeout = project, mode, init_timeout
        self._run: Any = None  # a wandb Run once started (not typed here: wandb's types pull in torch's)

    def advice(self) -> str:
        return "WANDB_MODE and wandb login (WANDB_MODE=offline keeps the run's files for wandb sync), or drop " \
               "wandb from the trackers"

    @side_channel
    def on_start(self, run: Run) -> None:
        wandb = require("wandb", "the wandb tracker")
        saved = self._saved_id(run)
        directory = str(run.run_dir) if run.run_dir is not None else None
        bound = {} if self.init_timeout is None or "WANDB_INIT_TIMEOUT" in os.environ else {
            "init_timeout": self.init_timeout}  # the user's setting wins, as W&B's would over its default
        self._run = wandb.init(project=self.project, mode=self.mode, dir=directory, config=self._config(run),
                               id=saved, resume="must" if saved else None,
                               name=run.run_dir.name if run.run_dir is not None else run.name,
                               settings=wandb.Settings(silent=True, console="off", **bound))
        if saved is None:
            self._save_id(run, self._run.id)
        self._run.define_metric("*", step_metric="step")

    @side_channel
    def on_log(self, run: Run, row: dict[str, Any]) -> None:
        self._run.log({"step": row["step"], **{f"train/{k}": v for k, v in _numbers(row).items()}})

    @side_channel
    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        self._run.log({"step": record["step"], **_epoch_metrics(record)})

    @side_channel
    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        if self._run is not None:
            self._run.summary.update(_numbers(summary))

    @side_channel
    def after_files(self, run: Run) -> None:
        if self._run is not None:
            for path in self._artifacts(run):
                self._run.save(str(path), base_path=str(path.parent), policy="now")
            self._run.finish(exit_code=0)
            self._run = None


class CSV(Tracker):
    """metrics.csv in the run directory: every row of metrics.jsonl (training rows and epoch
    records) as one table, a column per figure, rewritten after each epoch and at the end (so that
    a resumed run's file holds the resumed history, like metrics.jsonl)."""

    name_in_ids = "csv"

    def advice(self) -> str:
        return "the run directory's disk (free space), or drop csv from the trackers"

    def _write(self, run: Run) -> None:
        if run.run_dir is None or not (run.run_dir / "metrics.jsonl").is_file():
            return
        rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines() if line]
        columns = list(dict.fromkeys(k for row in rows for k in row))
        path = run.run_dir / "metrics.csv"
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, columns)
        writer.writeheader()
        writer.writerows(rows)
        write_text(path, text.getvalue())

    @side_channel
    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        self._write(run)

    @side_channel
    def after_files(self, run: Run) -> None:
        self._write(run)


TRACKERS = {"mlflow": MLflow, "wandb": WandB, "csv": CSV}  # keyed as config.TRACKERS names them


def make_trackers(names: str) -> list[Tracker]:
    """The trackers `TrainConfig.track` names ("mlflow,csv"; checked by the config), each with its defaults."""
    return [TRACKERS[name.strip()]() for name in names.split(",") if name.strip()]
