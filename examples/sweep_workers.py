"""A 16-trial sweep with 2 workers, on SQLite and on a PostgreSQL server, each best trial trained again.

Starts a PostgreSQL server in a temporary folder from the `pgserver` wheel (as the tests do; on a
cluster it is a server every machine reaches), runs

    jaxtrain sweep mlp-regression --data.samples 8000 --data.val-samples 1000 --epochs 3 \\
        --space optim.lr=loguniform:1e-4:3e-2 --trials 16 --workers 2 --storage URL --study NAME --out DIR

once with the default SQLite storage and once with the server's URL, then counts each study's
trials and run directories and re-runs each best trial's printed command, comparing its
validation loss. Needs the dev extras (`pip install -e ".[dev]"`).

    python examples/sweep_workers.py
"""

import json
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import optuna
import pgserver

FLAGS = ["--data.samples", "8000", "--data.val-samples", "1000", "--epochs", "3",
         "--space", "optim.lr=loguniform:1e-4:3e-2", "--trials", "16", "--workers", "2"]

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")  # pgserver's folder for its socket: /tmp then
with tempfile.TemporaryDirectory() as tmp:
    server = pgserver.get_server(Path(tmp) / "pg", cleanup_mode="stop")
    try:
        for storage, url in (("sqlite", None), ("postgresql", server.get_uri())):
            out = Path(tmp) / storage
            extra = ["--storage", url, "--study", "example"] if url else []
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "jaxtrain", "sweep", "mlp-regression", *FLAGS, *extra,
                            "--out", str(out)], check=True, capture_output=True)
            wall = time.perf_counter() - t0
            study = optuna.load_study(study_name="example" if url else "mlp-regression",
                                      storage=url or f"sqlite:///{out / 'study.db'}")
            states = [t.state.name.lower() for t in study.trials]
            best = study.best_trial
            command = shlex.split(best.user_attrs["command"])
            command += ["--run-dir", str(out / "again")]  # printed without one: runs/ by default
            subprocess.run([sys.executable, "-m", "jaxtrain", *command[1:], "--quiet"], check=True,
                           capture_output=True)
            again = json.loads((out / "again" / "summary.json").read_text())["best_val_loss"]
            print(f"{storage}: {len(study.trials)} trials in {wall:.0f} s ({states.count('complete')} complete, "
                  f"{states.count('pruned')} pruned), {len(list(out.glob('trial-*')))} run directories; best trial "
                  f"{best.number} val_loss {best.value:.8f}, its command again {again:.8f} "
                  f"(difference {abs(again - best.value):.1e})")
    finally:
        server.cleanup()
