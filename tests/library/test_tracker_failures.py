"""Trackers are side channels: a dead MLflow server at the start or one that dies mid-run, a W&B login
refused, a full disk under metrics.csv each turn that tracker off with one note on stderr, and the run
completes with its own files whole. MLflow's retries are bounded for our calls (seconds, not minutes)
without overriding the user's settings."""

import errno
import http.server
import json
import logging
import os
import socket
import threading
import time

import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import LambdaHook, TrainConfig
from jaxtrain._src.hooks import trackers
from jaxtrain._src.loop import RunOptions, run

DATA = regression_data(64)


def _fit(run_dir, track, epochs=3, hooks=()):
    config = TrainConfig(epochs=epochs, batch_size=16, steps_per_call=2, log_every=2, tensorboard=False, track=track)
    return run(small_mlp(), mse, DATA, None, config, hooks=list(hooks), run_dir=run_dir, verbosity="summary",
               session=RunOptions(console=silent()))


class FakeMLflow(http.server.ThreadingHTTPServer):
    """Answers the MLflow REST calls a tracker makes (an experiment, a run, batches logged), counting
    the logged metrics, until `stop()`: then the port is closed, as a killed server's is."""

    def __init__(self):
        self.metrics: list[dict] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # experiments/get-by-name
                self._answer({"experiment": {"experiment_id": "1", "name": "jaxtrain", "lifecycle_stage": "active"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path.endswith("/runs/create"):
                    self._answer({"run": {"info": {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1",
                                                   "status": "RUNNING", "lifecycle_stage": "active",
                                                   "artifact_uri": "/nowhere"}, "data": {}}})
                    return
                server.metrics += body.get("metrics", [])
                self._answer({})

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_mlflow_server_at_the_start_is_one_note_and_training_goes_on(tmp_path, monkeypatch, capsys, caplog):
    pytest.importorskip("mlflow")
    from urllib3.util.retry import Retry  # MLflow's client retries through it
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    for name in trackers.MLFLOW_HTTP_BOUNDS:  # MLflow's own defaults retried for minutes; ours bound it
        monkeypatch.delenv(name, raising=False)
    caplog.set_level(logging.WARNING)
    waits = []  # the backoff before each retry, recorded instead of slept: the bound is checked, not waited for
    monkeypatch.setattr(Retry, "_sleep_backoff", lambda self: waits.append(self.get_backoff_time()))
    t0 = time.monotonic()
    result = _fit(tmp_path / "run", "mlflow", epochs=1)
    assert time.monotonic() - t0 < 60
    assert waits and sum(waits) < 10, waits  # 2-4 s of backoff, jitter included; MLflow's defaults ask about 4 min
    assert capsys.readouterr().err.splitlines() == [
        f"note: the mlflow tracker could not start (ConnectionRefusedError: [Errno 111] Connection refused); it is "
        f"off for the rest of this run, which goes on (check that the MLflow server at {url} answers, or drop "
        "mlflow from the trackers)"]
    assert not [r for r in caplog.records if r.name.startswith("urllib3")]  # no warning per retry
    assert result.summary["status"] == "completed" and not (tmp_path / "run" / "trackers.json").exists()


def test_an_mlflow_server_killed_mid_run_is_one_note_and_the_run_completes(tmp_path, monkeypatch, capsys, caplog):
    pytest.importorskip("mlflow")
    server = FakeMLflow()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    for name in trackers.MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")  # the user's setting is kept: no waits here
    kill = LambdaHook(on_epoch_end=lambda run, record: server.stop() if run.epoch == 1 else None)
    caplog.set_level(logging.WARNING)
    run_dir = tmp_path / "run"
    try:
        result = _fit(run_dir, "mlflow", hooks=[kill])  # the user's hooks run before the trackers
    finally:
        if server.socket.fileno() != -1:
            server.stop()
    logged = {(m["key"], m["step"]) for m in server.metrics}
    assert ("train.loss", 2) in logged and ("train.loss", 4) in logged  # epoch 1 reached the server
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("note: the mlflow tracker failed at step 4 (ConnectionRefusedError: [Errno 111] "
                             "Connection refused); it is off for the rest of this run, which goes on (check that "
                             f"the MLflow server at {server.url} answers"), err[0]
    assert not [r for r in caplog.records if r.name.startswith("urllib3")]  # no warning per retry
    assert result.summary["status"] == "completed" and len(result.history) == 3
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "epoch"] == [4, 8, 12]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert json.loads((run_dir / "trackers.json").read_text()) == {"mlflow": "r1"}
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # set for the calls only


def test_mlflow_calls_are_bounded_without_overriding_the_users_settings(monkeypatch):
    for name in trackers.MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")  # the user's
    with trackers._bounded_http():
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "60"
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == trackers.MLFLOW_HTTP_BOUNDS[
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
        assert logging.getLogger("urllib3.connectionpool").getEffectiveLevel() == logging.ERROR
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "60" and "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_a_refused_wandb_login_and_a_full_disk_under_csv_are_a_note_each(tmp_path, monkeypatch, capsys):
    wandb = pytest.importorskip("wandb")
    import csv

    def refused(**kwargs):
        raise wandb.errors.CommError("Error communicating with wandb process")

    monkeypatch.setattr(wandb, "init", refused)
    writes = []

    def full(self, rows):  # metrics.csv is written at each epoch's end: the second write meets a full disk
        writes.append(len(rows))
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, rows)

    real = csv.DictWriter.writerows
    monkeypatch.setattr(csv.DictWriter, "writerows", full)
    run_dir = tmp_path / "run"
    result = _fit(run_dir, "wandb,csv")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("note: the wandb tracker could not start (CommError: Error communicating with wandb "
                             "process); it is off for the rest of this run, which goes on (check WANDB_MODE")
    assert err[1].startswith("note: the csv tracker failed at step 8 (OSError: [Errno 28] No space left on device)")
    assert result.summary["status"] == "completed" and len(result.history) == 3
    assert len(writes) == 2  # not asked again once off
    with open(run_dir / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [int(r["step"]) for r in table if r["kind"] == "epoch"] == [4]  # the first epoch's table, whole


def _wandb_services() -> list[str]:
    """The wandb service processes (wandb-core) this test process started and that still run."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and "wandb" in command:
            found.append(command)
    return found


def test_an_unreachable_wandb_server_costs_the_init_timeout_then_one_note(tmp_path, monkeypatch, capsys):
    """W&B online with nothing listening at its server: `wandb.init` gives up after the tracker's
    init_timeout (W&B's default waited 90 s), one note says so, and the run completes, its files whole."""
    wandb = pytest.importorskip("wandb")
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    for name in ("WANDB_MODE", "WANDB_INIT_TIMEOUT", "WANDB_SILENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.setenv("WANDB_API_KEY", "0123456789" * 4)  # a key of the right form: no login prompt
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    try:
        result = _fit(run_dir, "", epochs=1, hooks=[trackers.WandB(mode="online", init_timeout=1)])
        elapsed = time.monotonic() - t0
    finally:
        wandb.teardown()  # its service process, started for this run, ends with it
    assert elapsed < 30, elapsed  # about 1-2 s here
    err = capsys.readouterr().err.strip().splitlines()  # W&B's own line about the key found is W&B's to say
    notes = [line for line in err if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: the wandb tracker could not start ("), err
    assert "connection refused" in notes[0] and "it is off for the rest of this run, which goes on" in notes[0]
    assert result.summary["status"] == "completed"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "epoch"] == [4]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert not (run_dir / "trackers.json").exists()
    assert _wandb_services() == []


def test_the_wandb_init_timeout_reaches_wandb_unless_the_environment_sets_it(monkeypatch):
    wandb = pytest.importorskip("wandb")
    seen = []
    def init(settings, **kwargs):
        seen.append(settings.init_timeout if "init_timeout" in settings.model_fields_set else None)
        raise RuntimeError("no server here")

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.delenv("WANDB_INIT_TIMEOUT", raising=False)
    run = type("R", (), {"run_dir": None, "resumed_step": None, "name": "t", "config": TrainConfig(), "step": 0})()
    for tracker in (trackers.WandB(), trackers.WandB(init_timeout=3)):
        tracker.on_start(run)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "45")  # the user's setting is left for W&B to read
    trackers.WandB().on_start(run)
    assert seen == [trackers.WANDB_INIT_TIMEOUT_S, 3, None]
