"""Progress figures (issue 61, item 7): the rate and ETA of the lines and the bar are the steps that
finished over the seconds they took, from the first reading, however many steps a call fuses.

The loop is simulated with a fake clock: calls are queued at once (JAX dispatch is asynchronous), the
device runs them one after the other at `STEPS_PER_S`, the host waits for the previous call before it
hands the next one on (as `training.train`), and rows come when their steps' values are fetched."""

from __future__ import annotations

import io
import types

import pytest
from rich.console import Console
from rich.progress import ProgressColumn

import jaxtrain._src.report.progress as progress_module
from jaxtrain._src.hooks import ProgressHook
from jaxtrain._src.report import EpochProgress

STEPS_PER_S, BATCH, STEPS, LOG_EVERY = 2.0, 8, 20, 2  # the true throughput: 16 samples/s


class _Output:
    """A call's output: ready once the fake clock passed its finish time (`jax.Array.is_ready`)."""

    def __init__(self, now: list[float], finish: float):
        self.now, self.finish = now, finish

    def is_ready(self) -> bool:
        return self.now[0] >= self.finish


def _simulate(k: int, terminal: bool, monkeypatch: pytest.MonkeyPatch, timed: int = 0,
              sync: bool = False) -> tuple[str, list[str]]:
    """One epoch of STEPS steps in calls of `k` through `ProgressHook`; returns the printed text and
    the bar's rate column as rendered after each call (empty for lines). The first `timed` calls are
    the run's calibration: each waits for its steps and takes 5 times as long (the forms timed beside it).
    `sync`: the dispatch returns once the call computed (XLA:CPU often runs it on the dispatching thread)."""
    now = [0.0]
    monkeypatch.setattr(progress_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=terminal)
    hook = ProgressHook(console)
    hook._bar = EpochProgress(console, BATCH)
    run = types.SimpleNamespace(epoch=1, step=0, queued=0, config=types.SimpleNamespace(epochs=1), last_epoch=1,
                                feed=types.SimpleNamespace(steps_per_epoch=STEPS),
                                loop=types.SimpleNamespace(position=0),
                                calls=types.SimpleNamespace(compile_s=0.0, calibrating=timed > 0))
    logged, renders, device_free, finishes = 0, [], 0.0, []

    def rows(done: int) -> None:  # every log window whose steps finished, fetched now
        nonlocal logged
        while logged + LOG_EVERY <= done:
            logged += LOG_EVERY
            hook.on_log(run, {"step": logged, "loss": 1.0})

    hook.on_epoch_start(run)
    while run.loop.position < STEPS:
        device_free = max(now[0], device_free) + k / STEPS_PER_S  # queued now, it runs after the previous
        finishes.append(device_free)
        if len(finishes) <= timed:  # a timed call: the host waits for it
            now[0] = device_free = device_free + 4 * k / STEPS_PER_S
            run.calls.calibrating = len(finishes) < timed
        elif sync:
            now[0] = device_free
        elif len(finishes) > 1:
            now[0] = max(now[0], finishes[-2])  # wait for the previous call
        run.loop.position += k
        run.step, run.queued = run.step + k, k  # as `Run.advance`
        rows(run.loop.position - k)
        hook.after_call(run, k, {"loss": _Output(now, device_free)})
        if terminal:
            task = hook._bar._progress.tasks[0]
            columns = [c for c in hook._bar._progress.columns if isinstance(c, ProgressColumn)]
            renders.append(" ".join(str(c.render(task)) for c in columns))
    now[0] = finishes[-1]  # the epoch waits for its last call
    run.queued = 0  # as `Run.end_epoch`
    rows(STEPS)
    hook.result_only = True  # the epoch's end without its summary block
    hook.on_epoch_end(run, {})
    return out.getvalue(), renders


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize("k", [1, 2, 10, STEPS], ids=["k1", "k2", "k10", "fused-epoch"])
def test_progress_lines_read_the_true_rate_and_eta_from_the_first_line(k, sync, monkeypatch):
    text, _ = _simulate(k, terminal=False, monkeypatch=monkeypatch, sync=sync)
    lines = [line.split() for line in text.splitlines() if line.startswith("  epoch 1/1 step")]
    assert len(lines) == STEPS // LOG_EVERY
    for line in lines:
        rate = float(line[line.index("samples/s") - 1].replace(",", ""))
        assert rate == pytest.approx(STEPS_PER_S * BATCH, rel=0.2), line  # the first reading too
    if sync:
        return
    # the ETA: the steps not yet finished at the true rate (the first line's, one call in)
    first = lines[0]
    step = int(first[3].split("/")[0])
    finished = max(step, min(STEPS, (step + k - 1) // k * k))  # its row is fetched once its call finished
    assert float(first[first.index("ETA") + 1]) == pytest.approx((STEPS - finished) / STEPS_PER_S, abs=1.0)


def test_the_bar_reads_the_true_rate_and_counts_finished_steps_not_queued_ones(monkeypatch):
    _, renders = _simulate(2, terminal=True, monkeypatch=monkeypatch)
    assert "-- steps/s" in renders[0]  # the first call is queued, nothing has finished: no reading yet
    for shown in renders[1:]:  # from the first reading: 2 steps/s, 16 samples/s
        assert "2 steps/s 16 samples/s" in shown, shown
    assert "2/20" in renders[1] and "ETA 9 s" in renders[1]  # 2 steps finished, 18 left at 2 steps/s


def test_the_runs_timed_first_calls_are_not_in_the_rate(monkeypatch):
    text, _ = _simulate(2, terminal=False, monkeypatch=monkeypatch, timed=2)
    lines = [line.split() for line in text.splitlines() if line.startswith("  epoch 1/1 step")]
    rates = [line[line.index("samples/s") - 1] for line in lines]
    assert rates[0] == "--" and lines[0][-1] == "--"  # fetched while the run still timed its calls: no reading
    readings = [float(r.replace(",", "")) for r in rates if r != "--"]
    assert len(readings) >= len(rates) - 2  # a reading as soon as a step after the timed calls finished
    assert all(r == pytest.approx(STEPS_PER_S * BATCH, rel=0.2) for r in readings), rates
