"""`jaxtrain bench zoo`: models written elsewhere, trained through `jaxtrain.fit` and through the
hand-written loop their sources use (`benchmarks/zoo`).

For each model, fresh processes, interleaved (hand, fit, then fit, hand, ...):

- steady state: the hand loop's ms per step (its first, compiling step left out) against `fit`'s
  (its defaults: automatic form and K; a run directory with checkpoints), from `fit`'s second
  epoch, when the form and K are chosen and everything is compiled;
- a short run, about `short_s` seconds of the hand loop's steps: each process's wall time from
  launch to exit, `fit` with its defaults and no run directory, as a user's quick experiment;
- equal losses: from the same initial weights, the same batches in the same order and the same
  step keys, the per-step losses of `fit` and of the hand loop (one process).

The table gives medians, the form and K `fit` chose, and the ratios against the targets: steady
steps/s at least the hand loop's, short-run wall time at most 1.1x.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.child import child_environ
from jaxtrain._src.errors import ConfigError, JaxtrainError

STEADY_TARGET = 1.0  # fit's steady steps/s at least the hand loop's
SHORT_TARGET = 1.1  # fit's short-run wall time at most 1.1x the hand loop's
EQUAL_STEPS = 8
EQUAL_RTOL = 1e-4  # the forms round apart (~1e-7 a step); Adam's first steps amplify it a little


@dataclasses.dataclass(frozen=True)
class ZooBenchConfig:
    """Settings of the zoo benchmark."""

    models: str = ""
    """Comma-separated zoo names (default: all twelve; `--models list` prints them)."""
    repeats: int = 3
    """Steady-state processes of each way, interleaved."""
    short_repeats: int = 5
    """Short-run processes of each way, interleaved."""
    epoch_s: float = 3.0
    """Hand-loop seconds an epoch of the steady-state runs aims at (its steps: 16 to 512)."""
    short_s: float = 5.0
    """Hand-loop seconds of work a short run aims at."""
    quick: bool = False
    """One cheap model, one process of each way, a few steps: a smoke test."""
    out: str | None = None
    """Write the results as JSON to this file."""


def _child(args: list[str]) -> dict[str, Any]:
    """Runs this module as a child process: its JSON result and its wall seconds, launch to exit."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.zoo_bench", *args], capture_output=True,
                          text=True, env=child_environ())
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise JaxtrainError(f"zoo child {' '.join(args)} exited with code {proc.returncode}: "
                            f"{tail[-1] if tail else 'no output'}")
    return {**json.loads(lines[-1]), "wall_s": wall}


def _steps_for(seconds: float, step_s: float, low: int, high: int) -> int:
    return int(min(high, max(low, round(seconds / step_s))))


def _bench_model(name: str, config: ZooBenchConfig, console: Console) -> dict[str, Any]:
    quick = config.quick
    calibrate = _child([name, "hand", "16" if quick else "32"])  # the hand loop's step, to size the runs
    steps = 8 if quick else _steps_for(config.epoch_s, calibrate["step_s"], 16, 512)
    short_steps = 8 if quick else _steps_for(config.short_s, calibrate["step_s"], 16, 4096)
    repeats, short_repeats = (1, 1) if quick else (config.repeats, config.short_repeats)
    steady: dict[str, list[dict[str, Any]]] = {"hand": [], "fit": []}
    for rep in range(repeats):
        for way in sorted(steady, reverse=rep % 2 == 1):
            steady[way].append(_child([name, way, str(steps), "steady"]))
    short: dict[str, list[dict[str, Any]]] = {"hand": [], "fit": []}
    for rep in range(short_repeats):
        for way in sorted(short, reverse=rep % 2 == 1):
            short[way].append(_child([name, way, str(short_steps), "short"]))
    try:
        equal = _child([name, "equal", str(EQUAL_STEPS)])
    except JaxtrainError as e:  # e.g. a loader's batches with NaN labels, which fit refuses
        equal = {"rel_diff": float("nan"), "fit": [], "hand": [], "error": str(e)}
    hand_ms = statistics.median(r["step_s"] for r in steady["hand"]) * 1e3
    fit_ms = statistics.median(r["step_s"] for r in steady["fit"]) * 1e3
    hand_wall = statistics.median(r["wall_s"] for r in short["hand"])
    fit_wall = statistics.median(r["wall_s"] for r in short["fit"])
    spread = max(_spread([r["step_s"] for r in steady["hand"]]), _spread([r["step_s"] for r in steady["fit"]]))
    last = steady["fit"][-1]
    result = {"model": name, "steps": steps, "short_steps": short_steps, "hand_ms": hand_ms, "fit_ms": fit_ms,
              "speed": hand_ms / fit_ms, "spread": spread, "form": last["form"], "k": last["k"],
              "form_why": last["why"], "hand_short_s": hand_wall, "fit_short_s": fit_wall,
              "short_ratio": fit_wall / hand_wall, "loss_rel_diff": equal["rel_diff"],
              "fit_losses": equal["fit"], "hand_losses": equal["hand"],
              "runs": {"steady": steady, "short": short, "equal_error": equal.get("error")}}
    console.print(f"  {name}: hand {hand_ms:.2f} ms/step, fit {fit_ms:.2f} ms/step ({result['form']}, K={last['k']}); "
                  f"short run {hand_wall:.1f} s vs {fit_wall:.1f} s; losses within {equal['rel_diff']:.1e}")
    return result


def _spread(values: list[float]) -> float:
    """(max - min) / median of repeated timings: the measurement's own noise."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def main(config: ZooBenchConfig) -> int:
    from benchmarks.zoo import ZOO

    if config.models == "list":
        for name, zm in ZOO.items():
            print(f"{name:18} {zm.source}")
        return 0
    names = [n.strip() for n in config.models.split(",") if n.strip()] or list(ZOO)
    if config.quick and not config.models:
        names = ["custom-variable"] if "custom-variable" in ZOO else names[:1]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise ConfigError(f"unknown zoo model {unknown[0]!r}; choose among {', '.join(ZOO)} (or --models list)")
    console = Console(highlight=False, width=170)  # the table's ten columns
    console.print(f"zoo benchmark: {len(names)} model(s); steady state {config.repeats} and short runs "
                  f"{config.short_repeats} fresh processes of each way, interleaved"
                  + (" (quick)" if config.quick else ""))
    results = [_bench_model(name, config, console) for name in names]
    table = Table(title="jaxtrain.fit (defaults) against each source's hand-written loop, medians")
    for column in ("model", "hand ms/step", "fit ms/step", "fit steps/s ÷ hand", "spread", "form, K",
                   "short run: hand s", "fit s", "fit ÷ hand", "losses rel. diff"):
        table.add_column(column, justify="left" if column in ("model", "form, K") else "right")
    for r in results:
        table.add_row(r["model"], f"{r['hand_ms']:.2f}", f"{r['fit_ms']:.2f}", f"{r['speed']:.2f}x",
                      f"{r['spread']:.0%}", f"{r['form']}, {r['k']}", f"{r['hand_short_s']:.1f}",
                      f"{r['fit_short_s']:.1f}", f"{r['short_ratio']:.2f}x", f"{r['loss_rel_diff']:.1e}")
    console.print(table)
    met_steady = [r for r in results if r["speed"] >= STEADY_TARGET]
    within_noise = [r for r in results if r["speed"] >= STEADY_TARGET - r["spread"]]
    met_short = [r for r in results if r["short_ratio"] <= SHORT_TARGET]
    equal = [r for r in results if r["loss_rel_diff"] <= EQUAL_RTOL]
    for r in results:
        if r["loss_rel_diff"] != r["loss_rel_diff"]:  # NaN: not compared
            console.print(f"  {r['model']}: losses not compared: {r['runs']['equal_error']}")
    console.print(f"steady state, fit >= {STEADY_TARGET}x the hand loop's steps/s: {len(met_steady)}/{len(results)} "
                  f"(within the measurement's spread: {len(within_noise)}/{len(results)})")
    console.print(f"short runs, fit <= {SHORT_TARGET}x the hand loop's wall time: {len(met_short)}/{len(results)}")
    console.print(f"equal losses over {EQUAL_STEPS} steps (rel. diff <= {EQUAL_RTOL:g}): {len(equal)}/{len(results)}")
    if config.out:
        Path(config.out).write_text(json.dumps({"results": results, "quick": config.quick}, indent=2) + "\n")
    return 0 if len(equal) == len(results) else 1


# ---- the child processes: one way of training one model -------------------------------------


def _data(zm: Any, steps: int, seed: int = 0) -> dict[str, Any]:
    return zm.make_data(steps * zm.batch_size, seed)


def _nan_labels() -> Any:
    import jaxtrain

    return jaxtrain.DataConfig(allow_nan=True)  # gnn's missing labels are NaN, as ogbg_molpcba stores them


def _run_hand(zm: Any, steps: int, mode: str) -> dict[str, Any]:
    from benchmarks.zoo.hand import hand_loop

    losses, step_s = hand_loop(zm, _data(zm, steps), steps, seed=0)
    return {"step_s": step_s, "final_loss": losses[-1]}


def _run_fit(zm: Any, steps: int, mode: str) -> dict[str, Any]:
    import jaxtrain

    data = _data(zm, steps)
    if mode == "short":  # a user's quick experiment: fit's defaults, nothing written
        result = jaxtrain.fit(zm.make_model(0), zm.loss_fn, data, config=jaxtrain.TrainConfig(
            epochs=1, batch_size=zm.batch_size, data=_nan_labels()), optimizer=zm.optimizer(), verbosity="silent")
        return {"final_loss": result.final_train_loss, **_form(result)}
    with tempfile.TemporaryDirectory() as tmp:  # steady state: a run directory, checkpoints at epoch ends
        config = jaxtrain.TrainConfig(epochs=2, batch_size=zm.batch_size, tensorboard=False, data=_nan_labels())
        result = jaxtrain.fit(zm.make_model(0), zm.loss_fn, data, config=config, optimizer=zm.optimizer(),
                              run_dir=Path(tmp) / "run", verbosity="silent")
    second = result.history[-1]
    return {"step_s": second["train_time_s"] / steps, "final_loss": result.final_train_loss, **_form(result)}


def _form(result: Any) -> dict[str, Any]:
    form = result.summary["step_form"]
    return {"form": form["form"], "why": form["why"], "k": result.summary["steps_per_call"]}


def _run_equal(zm: Any, steps: int) -> dict[str, Any]:
    """Per-step losses of fit and of the hand loop from the same weights, batches and keys."""
    import jax
    import numpy as np

    import jaxtrain
    from benchmarks.zoo.hand import hand_losses

    data, B, seed = _data(zm, steps), zm.batch_size, 0
    batches = [{k: v[i * B:(i + 1) * B] for k, v in data.items()} for i in range(steps)]
    # fit's step keys (see `make_train_step`): step s gets split(fold_in(rng, s))[1], rng = split(key(seed))[0]
    rng = jax.random.split(jax.random.key(seed))[0]
    keys = jax.numpy.stack([jax.random.split(jax.random.fold_in(rng, s))[1] for s in range(steps)])
    hand = hand_losses(zm, zm.make_model(seed), batches, keys)
    seen: list[Any] = []
    hook = jaxtrain.LambdaHook(after_call=lambda run, k, metrics: seen.append(metrics["loss"]))
    jaxtrain.fit(zm.make_model(seed), zm.loss_fn, lambda: iter(batches), config=jaxtrain.TrainConfig(
        epochs=1, batch_size=B, seed=seed, steps_per_epoch=steps, data=_nan_labels()), optimizer=zm.optimizer(),
        hooks=[hook],
        verbosity="silent")
    fit = np.concatenate([np.asarray(jax.device_get(m), np.float64).reshape(-1) for m in seen])
    rel = float(np.max(np.abs(fit - hand) / np.maximum(np.abs(hand), 1e-12)))
    return {"fit": fit.tolist(), "hand": hand.astype(np.float64).tolist(), "rel_diff": rel}


def _child_main(argv: list[str]) -> int:
    from benchmarks.zoo import ZOO

    name, way, steps, *mode = argv
    zm, steps = ZOO[name], int(steps)
    if way == "equal":
        out = _run_equal(zm, steps)
    else:
        out = (_run_hand if way == "hand" else _run_fit)(zm, steps, mode[0] if mode else "steady")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
