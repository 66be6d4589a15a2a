"""`ProfileHook`: where a run's wall time went, in every run (`summary["profile"]`, the final block).

The loop's host thread is the clock. Each second of the training loop (compilation excluded) is
spent on one of:

- input: waiting for streamed batches (`StreamFeed`); the part of that wait due to host→device
  copies ("transfer") is estimated as the wait times the share of training time the transfer
  thread spent copying.
- compute: waiting for the device to finish a call (`CompiledCalls.wait`, and the stream feed's
  wait for the running call), less the device's fixed cost per call.
- dispatch: the per-call overhead: handing calls to the device (`CompiledCalls.dispatch_s`), the
  loop's own Python, and the device's fixed cost per call: the AutoSteps fit's overhead when K was
  measured (the run's own calls), else the round trip of a trivial jitted call that takes the run's
  state buffers.

FLOP/s are put against the device's float32 matmul rate that `jaxtrain doctor` or `jaxtrain profile`
recorded for this machine (`_src.machine`), or the one passed in; fit never benchmarks the machine.
- host sync: the hooks' work after each call (fetching metrics, logging, a hook reading values).

The whole run adds compilation, the one-off copy of data held on the device, evaluation and the
other hooks' work at epoch boundaries, and the rest (building, checks, files) as "other".
`report.profile_report.build_profile` turns these seconds into shares, FLOP/s and a verdict.

FLOPs: XLA's cost analysis of the compiled K-step call. XLA counts a loop's body once; a probe
finds out whether it does, and the count is scaled by K (and the gradient-accumulation loop) if so.
Loops inside the model (a scan over layers) still count once: the FLOPs are then a lower bound.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax

from jaxtrain._src.errors import JaxtrainError
from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.hooks.progress import FINISHED
from jaxtrain._src.machine import cached_matmul_rate
from jaxtrain._src.report.blocks import device_description
from jaxtrain._src.report.profile_report import build_profile

__all__ = ["ProfileBudgetReached", "ProfileHook"]


class ProfileBudgetReached(JaxtrainError):
    """Raised by `ProfileHook(budget_s=...)` to end a profiling run mid-epoch (caught by
    `jaxtrain.tools.diagnose.profile_recipe`); the profile is in the summary all the same."""

    exit_code = 0


class ProfileHook(RunHook):
    """Measures where the run's time goes and adds `summary["profile"]` at the end.

    `fit` adds one to every run; pass your own in `hooks` to set its options (it replaces the default).

    Args:
      budget_s: end training (with `ProfileBudgetReached`) once this many seconds were trained.
      trace_dir: record a `jax.profiler` trace of the training (from `on_start` to the end) there,
        for TensorBoard's profile plugin or Perfetto.
      peak_flop_s: the device's float32 matmul rate (FLOP/s) to put the run's FLOP/s against; None
        reads the rate `jaxtrain doctor` or `jaxtrain profile` recorded for this machine
        (`jaxtrain._src.machine`), if any. The hook never benchmarks the machine itself.
    """

    def __init__(self, budget_s: float | None = None, trace_dir: str | os.PathLike | None = None,
                 peak_flop_s: float | None = None):
        self.budget_s, self.trace_dir, self.peak_flop_s = budget_s, trace_dir, peak_flop_s
        self.profile: dict[str, Any] | None = None
        self.memory: dict[str, Any] | None = None
        self.budget_reached = False
        self._train_s = self._epoch_compile_s = 0.0
        self._calls = self._steps = 0
        self._open = self._tracing = False
        self._t0 = self._c0 = self._t_last = self._c_last = 0.0
        self._prepared = False  # `CallOverhead.prepare` asked

    def on_start(self, run: Run) -> None:
        if not run.calls.measuring:
            self._prepare(run)
        if self.trace_dir is not None:
            jax.profiler.start_trace(str(self.trace_dir))
            self._tracing = True

    def _prepare(self, run: Run) -> None:
        """XLA's counting rule and, when K was not measured, the call-overhead probe (small
        compiles), prepared beside the training rather than after it (`CallOverhead`); once the
        timed calls that choose the form and K are over, so as not to disturb them."""
        run.calls.overhead.prepare(None if run.calls.chooser.fitted else run.state)
        self._prepared = True

    def on_epoch_start(self, run: Run) -> None:
        self._open = True
        self._t0 = self._t_last = time.perf_counter()
        self._c0 = self._c_last = run.calls.compile_s

    def after_call(self, run: Run, k: int, metrics: dict[str, jax.Array]) -> None:
        if not self._prepared and not run.calls.measuring:
            self._prepare(run)
        self._calls, self._steps = self._calls + 1, self._steps + k
        self._t_last, self._c_last = time.perf_counter(), run.calls.compile_s
        if self.budget_s is not None and self._train_s + self._open_s() >= self.budget_s:
            run.calls.wait(metrics)  # the call's device time belongs to the timed training
            self._t_last = time.perf_counter()
            self._close()
            self.budget_reached = True
            raise ProfileBudgetReached(f"profiled {run.step:,} steps: the time budget of {self.budget_s:g} s is "
                                       "reached")

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        self._train_s += record["train_time_s"]
        self._open = False
        self._epoch_compile_s += run.calls.compile_s - self._c_last  # programs compiled by evaluation

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        if self._tracing:
            jax.profiler.stop_trace()
            self._tracing = False
        if self._open:  # stopped inside an epoch: up to the last call announced
            self._close()
        if self._calls == 0 or not (summary["status"] in FINISHED or self.budget_reached):
            return  # a failed run's state may be gone: no profile
        self.profile = build_profile(self._measurements(run, summary))
        summary["profile"] = self.profile
        self.memory = summary.get("memory")  # the run's memory section (`MemoryHook`), for `jaxtrain profile`

    def _open_s(self) -> float:
        """Seconds trained in the open epoch, up to the last call announced (compilation left out)."""
        return self._t_last - self._t0 - (self._c_last - self._c0)

    def _close(self) -> None:
        self._train_s += self._open_s()
        self._open = False

    def _measurements(self, run: Run, summary: dict[str, Any]) -> dict[str, Any]:
        """The seconds, counts and rates `build_profile` needs."""
        calls, config, feed = run.calls, run.config, run.feed
        timing = getattr(feed, "timing", {})
        hook_s: dict[str, dict[str, float]] = {}
        for (name, event), seconds in run.hook_s.items():
            hook_s.setdefault(event, {})
            hook_s[event][name] = hook_s[event].get(name, 0.0) + seconds
        if not self._prepared:  # a run that measured to its end
            self._prepare(run)
        calls.overhead.join()
        if calls.chooser.fitted:  # measured on the run's own calls: no probe needed
            dispatch_s = calls.dispatch_s / max(self._calls, 1)
            device_overhead_s = max(calls.chooser.fitted[1] - dispatch_s, 0.0)
        else:
            dispatch_s, round_trip_s = calls.overhead.measure(run.state)
            device_overhead_s = round_trip_s - dispatch_s
        k = calls.k if any(c.get("k") == calls.k for c in calls.compiles) else max(
            c["k"] for c in calls.compiles if "k" in c)
        per_step = calls.flops_per_step(k, config.grad_accum)
        flops = None if per_step is None else per_step * k
        return {
            "wall_s": summary["total_time_s"], "train_s": self._train_s, "calls": self._calls, "steps": self._steps,
            "steps_per_call": calls.k, "longest_call": calls.longest, "k_fixed": calls.chooser.fixed,
            "fitted": calls.chooser.fitted,
            "step_form": calls.form.summary(),
            "steps_per_epoch": feed.steps_per_epoch, "batch_size": config.batch_size,
            "samples_per_step": config.samples_per_step, "log_every": config.log_every,
            "precision": config.precision, "placement": feed.placement.where,
            "platform": run.device.platform, "device": device_description(run.device),
            "devices": run.layout.num_devices, "compile_s": calls.compile_s, "compiles": list(calls.compiles),
            "epoch_compile_s": self._epoch_compile_s,
            "setup_copy_s": timing.get("setup_copy_s", 0.0), "input_wait_s": timing.get("input_wait_s", 0.0),
            "background_copy_s": timing.get("background_copy_s", 0.0),
            "device_wait_s": calls.wait_s + timing.get("device_wait_s", 0.0), "dispatch_s": calls.dispatch_s,
            "device_overhead_per_call_s": device_overhead_s,
            "after_call_hooks_s": hook_s.get("after_call", {}),
            "user_hooks": sorted({type(h).__name__ for h in run.hooks if not isinstance(h, RunHook)}),
            "epoch_hooks_s": sum(hook_s.get("on_epoch_start", {}).values())
            + sum(hook_s.get("on_epoch_end", {}).values()),
            "flops_per_step": None if flops is None else flops / k,
            "peak_flop_s": self.peak_flop_s or cached_matmul_rate(run.device),
            "budget_reached": self.budget_reached,
        }
