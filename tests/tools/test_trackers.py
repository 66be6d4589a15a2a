"""Experiment trackers (`--track mlflow,wandb,csv`): a real MLflow server started here and read back
with `MlflowClient`, W&B's offline run files read back record by record, metrics.csv; a resumed
run continues the same tracked run."""

import csv
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from jaxtrain.tools.cli import main

TRAIN = ["train", "mlp-regression", "--data.samples", "1200", "--data.val-samples", "200", "--model.hidden", "32",
         "--log-every", "10", "--steps-per-call", "10", "--quiet"]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a local SQLite store, started for these tests and stopped after them. Without
    the server's job execution (MLflow's GenAI jobs, which tracking does not use): it starts six
    consumer processes, and the tracking test took 7.9 s with them and 3.0 s without (docs/benchmarks.md)."""
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow), "server", "--backend-store-uri", f"sqlite:///{root / 'store.db'}",
                             "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1", "--port",
                             str(port), "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(timeout=30)
    proc.stderr.close()  # its pipe, else left to the garbage collector (a ResourceWarning)


def test_mlflow_run_holds_every_metric_row_the_config_and_the_files_and_a_resume_appends(mlflow_server, tmp_path,
                                                                                         monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    run_dir = tmp_path / "run"
    assert main([*TRAIN, "--epochs", "2", "--track", "mlflow", "--run-dir", str(run_dir)]) == 0
    assert "View run" not in capsys.readouterr().out  # --quiet stays quiet
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    assert main([*TRAIN, "--epochs", "3", "--track", "mlflow", "--resume", str(run_dir)]) == 0
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"] == run_id

    client = MlflowClient(mlflow_server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["optim.lr"] == "0.001" and run.data.params["recipe"] == "mlp-regression"
    assert run.data.params["model.hidden"] == "[32]"
    assert len(client.search_runs([run.info.experiment_id])) == 1  # the resume continued it
    rows = _rows(run_dir)
    history = {key: {m.step: m.value for m in client.get_metric_history(run_id, key)}
               for key in ("train.loss", "train.lr", "val.loss", "epoch.train_loss")}
    train_rows = [r for r in rows if r["kind"] == "train"]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    assert len(epochs) == 3 and len(train_rows) >= 6
    for r in train_rows:
        assert history["train.loss"][r["step"]] == pytest.approx(r["loss"], rel=1e-12)
        assert history["train.lr"][r["step"]] == pytest.approx(r["lr"], rel=1e-12)
    for r in epochs:
        assert history["val.loss"][r["step"]] == pytest.approx(r["val_loss"], rel=1e-12)
        assert history["epoch.train_loss"][r["step"]] == pytest.approx(r["train_loss"], rel=1e-12)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert run.data.metrics["summary.best_val_loss"] == pytest.approx(summary["best_val_loss"], rel=1e-12)
    files = {a.path for a in client.list_artifacts(run_id)}
    assert {"summary.json", "config.json", "metrics.jsonl", "curves.png"} <= files
    local = client.download_artifacts(run_id, "summary.json", str(tmp_path))
    assert json.loads(Path(local).read_text())["steps"] == summary["steps"]


# W&B's offline run file: a 7-byte header, then LevelDB-log blocks of 32 KiB holding protobuf records.
_BLOCK, _FULL, _LAST = 32768, 1, 4


def _wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data, records, pending, pos = path.read_bytes(), [], b"", 7
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos: pos + 7])
        if kind == 0 and length == 0:
            break
        pending += data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_files_hold_every_metric_row_and_a_resume_continues_the_same_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    assert main([*TRAIN, "--epochs", "2", "--track", "wandb", "--run-dir", str(run_dir)]) == 0
    assert main([*TRAIN, "--epochs", "3", "--track", "wandb", "--resume", str(run_dir)]) == 0
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    files = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 2  # the first run and its resumption, one W&B run id
    history, summary, saved, config = {}, {}, set(), {}
    for path in files:
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                history.setdefault(row["step"], {}).update(row)
            elif kind == "summary":
                summary.update({u.key: json.loads(u.value_json) for u in record.summary.update if u.key})
            elif kind == "files":
                saved |= {f.path for f in record.files.files}
            elif kind == "run":
                config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
    rows = _rows(run_dir)
    for r in rows:
        if r["kind"] == "train":
            assert history[r["step"]]["train/loss"] == pytest.approx(r["loss"], rel=1e-12)
        else:
            assert history[r["step"]]["val/loss"] == pytest.approx(r["val_loss"], rel=1e-12)
    assert summary["best_val_loss"] == pytest.approx(json.loads((run_dir / "summary.json").read_text())[
        "best_val_loss"], rel=1e-12)
    assert {"summary.json", "metrics.jsonl", "curves.png", "config.json"} <= saved
    assert config["optim.lr"] == 0.001 and config["recipe"] == "mlp-regression"


def test_csv_holds_metrics_jsonl_as_a_table_and_follows_a_resume(tmp_path):
    run_dir = tmp_path / "run"
    assert main([*TRAIN, "--epochs", "2", "--track", "csv", "--run-dir", str(run_dir)]) == 0
    assert main([*TRAIN, "--epochs", "3", "--track", "csv", "--resume", str(run_dir)]) == 0
    with open(run_dir / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    rows = _rows(run_dir)
    assert len(table) == len(rows) and sum(r["kind"] == "epoch" for r in table) == 3
    for line, row in zip(table, rows):
        assert int(line["step"]) == row["step"] and line["kind"] == row["kind"]
        key = "loss" if row["kind"] == "train" else "val_loss"
        assert float(line[key]) == row[key]


def test_tracker_mistakes_are_one_line(tmp_path, capsys, monkeypatch):
    from conftest import mse, regression_data, small_mlp

    import jaxtrain

    assert main([*TRAIN, "--epochs", "1", "--track", "comet", "--run-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown tracker 'comet'" in err[0] and "mlflow, wandb, csv" in err[0]
    with pytest.raises(jaxtrain.ConfigError, match="needs a run directory"):
        jaxtrain.fit(small_mlp(), mse, regression_data(64), config=jaxtrain.TrainConfig(epochs=1, track="csv"),
                     verbosity="silent")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    assert main([*TRAIN, "--epochs", "1", "--track", "mlflow", "--run-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'the mlflow tracker needs mlflow' in err[0] and 'pip install -e ".[track]"' in err[0]
    assert not os.path.exists(tmp_path / "b")  # refused before the run directory is claimed

