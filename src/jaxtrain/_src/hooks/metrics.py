"""Training metrics: fetched from the device every `log_every` steps, checked for NaN/Inf, averaged
per log interval (the `on_log` rows of metrics.jsonl) and per epoch (the epoch record). A metric the
loss returns as a `jaxtrain.metrics` Stat (F1's counts, ...) is added up over the steps instead and
computed from the totals."""

from __future__ import annotations

from typing import Any, Protocol, TypeGuard

import jax
import numpy as np

from jaxtrain._src.errors import NonFiniteLossError, render, setting
from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.metrics import Stat, is_stat
from jaxtrain._src.report.notes import note

MOSTLY_SKIPPED = 0.5  # a run that skipped more than this share of its updates ends with a warning

LAST_VALUE = ("lr", "loss_scale", "scale_skips")  # per-step values a row reports at its last step, not averaged


class Sums:
    """Running float64 sums of per-step metrics; non-finite values are left out (they only occur
    with on_nan=skip) and counted as skipped steps. Stats (`jaxtrain.metrics`) are added up part by
    part over the steps whose loss is finite; `stats` holds their float64 parts by name (a resumed
    run's lack the metric until the next steps bring it)."""

    def __init__(self, sums: dict[str, float] | None = None, counts: dict[str, int] | None = None, skipped: int = 0,
                 stats: dict[str, dict[str, Any]] | None = None):
        self.sums, self.counts, self.skipped = dict(sums or {}), dict(counts or {}), skipped
        self.stats: dict[str, Stat] = {k: Stat(None, {p: np.asarray(x, np.float64) for p, x in parts.items()})  # type: ignore[arg-type]
                                       for k, parts in (stats or {}).items()}

    def add(self, values: dict[str, np.ndarray], stats: dict[str, Stat] | None = None) -> None:
        """`values`: each metric per step (n,); `stats`: Stats whose parts have a leading step axis (n, ...)."""
        finite_loss = np.isfinite(values["loss"]) if "loss" in values else None
        for name, v in values.items():
            finite = v[np.isfinite(v)].astype(np.float64)
            self.sums[name] = self.sums.get(name, 0.0) + float(finite.sum())
            self.counts[name] = self.counts.get(name, 0) + finite.size
            if name == "loss":
                self.skipped += v.size - finite.size
        for name, stat in (stats or {}).items():
            parts = {p: (x if finite_loss is None else x[finite_loss]).astype(np.float64).sum(axis=0)
                     for p, x in stat.parts.items()}
            old = self.stats.get(name)
            self.stats[name] = Stat(stat.metric, parts if old is None else {p: old.parts[p] + parts[p] for p in parts})

    def means(self) -> dict[str, float]:
        means = {k: self.sums[k] / self.counts[k] if self.counts[k] else float("nan") for k in self.sums}
        means.update({k: s.compute() for k, s in self.stats.items() if s.metric is not None})
        return means

    def to_json(self) -> dict[str, Any]:
        return {"sums": self.sums, "counts": self.counts, "skipped": self.skipped,
                "stats": {k: {p: np.asarray(x).tolist() for p, x in s.parts.items()} for k, s in self.stats.items()}}


class SharedTransfer(Protocol):
    """A call's metrics that come to the host in a transfer shared with others (a population member's)."""

    def host(self) -> dict[str, np.ndarray]: ...


def _shared(calls: list[dict[str, jax.Array]]) -> TypeGuard[list[SharedTransfer]]:
    return bool(calls) and hasattr(calls[0], "host")


def to_host(calls: list[dict[str, jax.Array]]) -> list[dict[str, np.ndarray]]:
    """Calls' metrics on the host, in one transfer; metrics that know a shared transfer (a
    population member's: `host()`) come from it, so P members cost one transfer, not P."""
    if _shared(calls):
        return [m.host() for m in calls]
    return jax.device_get(calls)


class MetricsHook(RunHook):
    """Fetches per-step metrics in groups of at least `log_every` steps (the only host syncs of
    the loop), stops on a non-finite loss (`on_nan="stop"`), emits one row per `log_every` steps
    and fills the epoch record's `train_*` means.

    Rows cover fixed step windows (steps 1–L, L+1–2L, ...), whatever the call length K, so a
    resumed run writes the same rows as an uninterrupted one.
    """

    name = "metrics"

    def __init__(self, log_every: int, on_nan: str = "stop"):
        self.log_every, self.on_nan = log_every, on_nan
        self._pending: list[tuple[int, int, dict[str, jax.Array]]] = []  # (steps before, k, device metrics)
        self._epoch, self._window, self._skipped_before = Sums(), Sums(), 0

    def after_call(self, run: Run, k: int, metrics: dict[str, jax.Array]) -> None:
        self._pending.append((run.step - k, k, metrics))
        finished = self._pending[:-1]  # all but the call just queued have finished
        if sum(n for _, n, _ in finished) >= self.log_every:
            self._fetch(run, finished)
            self._pending = self._pending[-1:]

    def flush(self, run: Run) -> None:
        self._fetch(run, self._pending)
        self._pending = []

    def _fetch(self, run: Run, calls: list[tuple[int, int, dict[str, jax.Array]]]) -> None:
        if not calls:
            return
        fetched: list[dict[str, Any]] = to_host([m for _, _, m in calls])  # arrays, and Stats of arrays
        first = calls[0][0]
        stats = {name: Stat(v.metric, {p: np.concatenate([np.asarray(f[name].parts[p]) for f in fetched])
                                       for p in v.parts}) for name, v in fetched[0].items() if is_stat(v)}
        values = {name: np.concatenate([np.asarray(f[name]).reshape(-1) for f in fetched])
                  for name in fetched[0] if name not in stats}
        bad = np.flatnonzero(~np.isfinite(values["loss"]))
        if bad.size and self.on_nan == "stop":
            raise NonFiniteLossError(first + int(bad[0]) + 1, float(values["loss"][bad[0]]), run.last_checkpoint())
        last = {name: values.pop(name) for name in LAST_VALUE if name in values}
        self._epoch.add(values, stats)
        L, n, s = self.log_every, len(values["loss"]), first
        while s < first + n:  # cut the steps into the fixed windows of L steps
            end = (s // L + 1) * L  # the window's last step (1-based)
            take = min(end, first + n) - s
            self._window.add({name: v[s - first : s - first + take] for name, v in values.items()},
                             {name: Stat(st.metric, {p: x[s - first : s - first + take] for p, x in st.parts.items()})
                              for name, st in stats.items()})
            s += take
            if s == end:
                row = {"kind": "train", "epoch": run.epoch, "step": end, **self._window.means(),
                       **{name: float(v[end - first - 1]) for name, v in last.items()}, "elapsed_s": run.elapsed_s}
                self._window = Sums()
                run.log(row)

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        self.flush(run)
        means = self._epoch.means()
        record["train_loss"] = means.pop("loss")
        record.update({f"train_{k}": v for k, v in means.items()})
        if self._epoch.skipped:
            record["skipped_steps"] = self._epoch.skipped
        self._skipped_before += self._epoch.skipped
        self._epoch = Sums()

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        skipped = summary["skipped_steps"] = self._skipped_before + self._epoch.skipped
        if run.step and skipped > MOSTLY_SKIPPED * run.step:  # "completed" alone would hide it
            warning = (f"{skipped:,} of {run.step:,} updates were skipped for a non-finite loss or gradient "
                       f"({setting('on_nan', 'skip')}): the model has barely trained; check the data for NaN/Inf "
                       f"values or lower the learning rate ({setting('optim.lr')})")
            summary["warning"] = render(warning, "python")
            note(warning)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch.to_json(), "window": self._window.to_json(), "skipped_total": self._skipped_before}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._epoch = Sums(**state["epoch"])
        self._window = Sums(**state.get("window", {}))
        self._skipped_before = state.get("skipped_total", 0)
