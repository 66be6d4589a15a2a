"""`jaxtrain bench sameseed`: do runs of one script and seed end bit for bit alike on a loaded machine?

The same training script (an MLP regression, seed 0, the form and K measured: `step_form="auto"`)
runs `--runs` times, each in a fresh process, while `--load` busy processes (`while 1: pass`) keep
the cores busy, in two arms:

- "kept": the runs share one fresh compile cache, where the first run keeps its measured form
  decision and the next ones reuse it (`form_memory`);
- "measured": `JAXTRAIN_FORM_MEMORY=off`, every run measures the forms afresh: only the chooser's
  margins keep the decision.

Each run prints its form, whether it was measured or reused, the forms' timings (ms per step) and
the final training loss's bits (hex) with a hash of the parameters; per arm, whether every run ended
identical. The model is mlp-regression's, whose forms time within a few percent (the case where a
timing could tip the decision) and round apart. `--quick`: two small runs of each arm, no load (a smoke test).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.child import child_main, run_child
from jaxtrain._src.errors import JaxtrainError

# mlp-regression's model and batch (128-512-512-64, batch 32): its forms time within a few percent and round
# apart (the scan's weights differ from the plain step's in the last bits); 2 epochs of 128 steps
FULL = {"width": 512, "d_in": 128, "d_out": 64, "samples": 4096, "batch": 32, "epochs": 2}
QUICK = {"width": 16, "d_in": 8, "d_out": 3, "samples": 256, "batch": 16, "epochs": 1}


@dataclasses.dataclass(frozen=True)
class SameSeedBenchConfig:
    """Settings of the same-seed benchmark."""

    runs: int = 5
    """Fresh processes of the script per arm."""
    load: int = 2
    """Busy processes (`while 1: pass`) running beside the runs: a loaded machine (0: none)."""
    quick: bool = False
    """Small runs (at most two per arm), no load: a smoke test."""
    out: str | None = None
    """Write the results as JSON to this file."""


def train(payload: dict[str, Any]) -> dict[str, Any]:
    """The script (in the child): trains seed 0's MLP, the form chosen automatically; its result's bits."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxtrain import TrainConfig, enable_compile_cache
    from jaxtrain._src import loop
    from jaxtrain._src.choosers import AutoSteps
    from jaxtrain._src.models import MLP

    if payload["cache"]:
        enable_compile_cache(payload["cache"])
    size = payload["size"]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(size["samples"], size["d_in"])).astype(np.float32)
    w = rng.normal(size=(size["d_in"], size["d_out"])).astype(np.float32) / np.sqrt(size["d_in"])
    data = {"x": x, "y": np.tanh(x @ w).astype(np.float32)}

    def mse(model: Any, batch: dict[str, Any], key: Any) -> tuple[Any, dict[str, Any]]:
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    model = MLP((size["d_in"], size["width"], size["width"], size["d_out"]), rngs=nnx.Rngs(0))
    config = TrainConfig(epochs=size["epochs"], batch_size=size["batch"], seed=0)
    session = loop.RunOptions(auto_steps=AutoSteps(short_run_calls=0), plots=False)  # measured, however short
    result = loop.run(model, mse, data, None, config, verbosity="silent", session=session)
    params = b"".join(np.asarray(p).tobytes() for p in jax.tree.leaves(result.state.params))
    form = result.summary["step_form"]
    return {"loss_hex": float(result.history[-1]["train_loss"]).hex(), "params_sha": hashlib.sha256(params).hexdigest(),
            "form": form["form"], "decided": form["decided"], "ms_per_step": form["ms_per_step"],
            "k": result.summary["steps_per_call"]}


def main(config: SameSeedBenchConfig) -> int:
    console = Console(highlight=False, width=160)
    runs, load = (min(config.runs, 2), 0) if config.quick else (config.runs, config.load)
    size = QUICK if config.quick else FULL
    shape = "-".join(str(size[n]) for n in ("d_in", "width", "width", "d_out"))
    console.print(f"same-seed benchmark: {runs} fresh runs per arm of one script and seed, {load} busy process(es) "
                  f"beside them; MLP {shape}, batch {size['batch']}, {size['epochs']} epoch(s) of "
                  f"{size['samples'] // size['batch']} steps")
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(load)]
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="jaxtrain-sameseed-") as cache:
            for arm, directory, memory in (("kept", cache, None), ("measured", None, "off")):
                results[arm] = []
                for i in range(runs):
                    result = run_child("benchmarks.sameseed", {"cache": directory, "size": size},
                                       env={"JAXTRAIN_COMPILE_CACHE": None, "JAX_COMPILATION_CACHE_DIR": None,
                                            "JAXTRAIN_FORM_MEMORY": memory})
                    if "error" in result:
                        raise JaxtrainError(f"run {i + 1} ({arm}) failed: {result['error']}")
                    results[arm].append(result)
                    console.print(f"  {arm}, run {i + 1}: {result['form']} ({result['decided']}), final loss "
                                  f"{result['loss_hex']}")
    finally:
        for process in busy:  # this benchmark's own processes, by their handles
            process.kill()
            process.wait()
    table = Table(title="final training loss of each run (bits) and its parameters")
    for column in ("arm", "run", "form", "decided", "K", "ms/step (timed)", "final loss (hex)", "params sha256"):
        table.add_column(column)
    for arm, rows in results.items():
        for i, r in enumerate(rows):
            timed = ", ".join(f"{f} {t:.3g}" for f, t in sorted(r["ms_per_step"].items()))
            table.add_row(arm, str(i + 1), r["form"], r["decided"], str(r["k"]), timed, r["loss_hex"],
                          r["params_sha"][:16])
    console.print(table)
    summary = {}
    for arm, rows in results.items():
        identical = len({(r["loss_hex"], r["params_sha"]) for r in rows}) == 1
        summary[arm] = identical
        console.print(f"  {arm}: {len(rows)} runs, {'bit-identical' if identical else 'NOT identical'} "
                      f"(forms: {', '.join(r['form'] for r in rows)})")
    if config.out:
        Path(config.out).write_text(json.dumps({"runs": results, "identical": summary, "load": load,
                                                "size": size}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    child_main(train)
