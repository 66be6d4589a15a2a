"""The choosers of a run's calls: K, the optimizer steps fused into one call, and the call's form.

Pure bookkeeping over timings the calls hand them: no JAX in here. `StepsPerCall` picks K from the
times of the run's first calls at two lengths (`AutoSteps` says how); `StepForm` picks the form (a
`lax.scan` over K steps, programs of U unrolled steps, or the plain step dispatched K times) from
timed segments of the run's first call. `calls.CompiledCalls.calibrate` times those calls and feeds
the choosers; `training.train` calls it for the run's first calls, in plain sight.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jaxtrain._src.config import STEP_FORMS as FORMS
from jaxtrain._src.errors import ConfigError

__all__ = ["FORM_PROBE", "AutoSteps", "StepForm", "StepsPerCall"]


@dataclasses.dataclass(frozen=True)
class AutoSteps:
    """How the automatic K is measured (used when `TrainConfig.steps_per_call` is 0).

    Attributes:
      probe_lengths: the two call lengths (K_a < K_b) timed at the start of the run.
      repeats: timed calls of each length; the fastest counts.
      overhead_target: the per-call overhead allowed, as a fraction of a call's compute.
      short_run_calls: a run of fewer steps than this many calls of K_b is not measured: it runs
        K_b. Measuring could only end in a longer program, whose saving over so few calls (their
        fixed cost, milliseconds each) cannot repay its compile, or in K_a, no faster; and its timed
        calls wait for every background compile (evaluation's) instead of training beside it.
        0 measures every run.
      slow_call_s: a short run's first call of K_b slower than this switches it to K_a (see
        `StepsPerCall.check`); a population, whose call trains every member, allows its members'
        share each.
      unroll: steps per program of the "unroll" form (its compile grows with them).
      form_probe_s: the time a timed segment of the form measurement aims at (its steps: this over
        the first step's time, 1 to `probe_lengths[0]`).
    """

    probe_lengths: tuple[int, int] = (16, 128)
    repeats: int = 3
    overhead_target: float = 0.02
    short_run_calls: int = 32
    slow_call_s: float = 1.0
    unroll: int = 4
    form_probe_s: float = 0.02

    def __post_init__(self) -> None:
        k_a, k_b = self.probe_lengths
        if not (isinstance(k_a, int) and isinstance(k_b, int) and 1 <= k_a < k_b):
            raise ConfigError(f"AutoSteps.probe_lengths={self.probe_lengths} must be two integers 1 <= K_a < K_b")
        if self.repeats < 1 or not self.overhead_target > 0 or self.short_run_calls < 0:
            raise ConfigError("AutoSteps.repeats must be >= 1, overhead_target > 0 and short_run_calls >= 0")
        if self.unroll < 2 or not self.form_probe_s > 0:
            raise ConfigError("AutoSteps.unroll must be >= 2 and form_probe_s > 0")


class StepsPerCall:
    """Chooses K, the optimizer steps fused into one compiled call.

    A K set by the user is used as is. Otherwise the first calls of the run (real training
    steps) are timed at two lengths, K_a and K_b: `t(K) = overhead + K * step` gives both
    costs, and K becomes the smallest length whose overhead is under `overhead_target` of its
    compute, never below K_a and never above an epoch. Epochs too short to measure use K_a; runs
    shorter than `short_run_calls` calls of K_b use K_b unmeasured (K_a if their first call of K_b
    takes over `slow_call_s`). A length beyond K_b means compiling one more program: given the
    run's `total_steps`, it is chosen only when its saving over the steps left exceeds a compile's
    time (`record`'s `compile_s`).
    """

    def __init__(self, fixed: int, steps_per_epoch: int, auto: AutoSteps = AutoSteps(),
                 total_steps: int | None = None):
        k_a, k_b = (min(k, steps_per_epoch) for k in auto.probe_lengths)
        self.fixed = bool(fixed)
        self.brief = total_steps is not None and total_steps < auto.short_run_calls * k_b  # K set or not
        self.short = not fixed and self.brief
        self.k = min(fixed, steps_per_epoch) if fixed else k_b if self.short else k_a
        self.fitted: tuple[float, float] | None = None  # (seconds per step, per call) once measured
        can_measure = (not fixed and not self.short and k_a < k_b
                       and auto.repeats * (k_a + k_b) <= steps_per_epoch)
        self._plan = [k_a] * auto.repeats + [k_b] * auto.repeats if can_measure else []
        self._times: dict[int, list[float]] = {}
        self._steps_per_epoch = steps_per_epoch
        self._target = auto.overhead_target
        self._remaining = steps_per_epoch  # steps left in the epoch at the last `next_length`
        self._steps_left = total_steps  # steps of the run not yet run (None: unknown)
        self._k_a, self._checked, self._slow_s = k_a, False, auto.slow_call_s
        self.slowed: tuple[int, float] | None = None  # (steps, seconds) of the call that switched K to K_a

    @property
    def measuring(self) -> bool:
        return bool(self._plan)

    def planned(self) -> list[int]:
        """The call lengths still to be timed, each once."""
        return sorted(set(self._plan))

    def next_length(self, remaining: int) -> int:
        """Steps for the next call, given the steps left in the epoch."""
        if self._plan and self._plan[0] > remaining:  # too close to the epoch's end to measure
            self._plan = []
        self._remaining = remaining
        return self._plan[0] if self._plan else min(self.k, remaining)

    def ran(self, k: int) -> None:
        """A call of k steps of the run was handed to the device."""
        self._steps_left = None if self._steps_left is None else self._steps_left - k

    def stop(self) -> None:
        """No K to measure (the calls are dispatched step by step): K_a, or the K set."""
        if not self.fixed and (self._plan or self.short):
            self._plan, self.short, self.k = [], False, self._k_a

    @property
    def checking(self) -> bool:
        """Whether the next call of a short run's K_b is timed (once), in case its steps are slow."""
        return self.short and self._k_a < self.k and not self._checked

    def check(self, k: int, seconds: float) -> str | None:
        """Takes the time of a short run's first full call of K_b: a call slower than
        `slow_call_s` means steps so slow that K_a's overhead is negligible too, and K_a keeps
        progress and stop signals responsive (its calls run K_b's program, masked: no compile).
        A run with no step left after that call keeps K_b: K_a would describe no call of it."""
        self._checked = True
        if k < self.k or seconds <= self._slow_s or (self._steps_left is not None and self._steps_left <= 0):
            return None
        self.k, self.slowed = self._k_a, (k, seconds)
        return (f"K={self.k} steps per compiled call (a call of {k} steps took {seconds:.1f} s: steps this slow "
                f"leave a call's overhead negligible at K={self.k})")

    def record(self, k: int, seconds: float, compile_s: float = 0.0) -> str | None:
        """Takes the time of a measured call; after the last one, picks K and describes why.
        `compile_s`: what compiling one more program would cost (e.g. the last one's time)."""
        self._times.setdefault(k, []).append(seconds)
        self._plan.pop(0)
        if self._plan:
            return None
        (k_a, t_a), (k_b, t_b) = sorted((k, min(ts)) for k, ts in self._times.items())
        step_s = max((t_b - t_a) / (k_b - k_a), 1e-9)
        overhead_s = max(t_a - k_a * step_s, 0.0)
        self.fitted = (step_s, overhead_s)
        needed = math.ceil(round(overhead_s / (self._target * step_s), 6))
        self.k = k_a if needed <= k_a else k_b if needed <= k_b else min(needed, self._steps_per_epoch)
        kept = ""
        if self.k > k_b and self._steps_left is not None:  # a new program: worth its compile?
            saving = self._steps_left * overhead_s * (1 / k_b - 1 / self.k)
            if saving < compile_s:
                kept = f"; K={self.k} would save {saving:.2f} s over the run, less than its compile ({compile_s:.2f} s)"
                self.k = k_b
        share = overhead_s / (overhead_s + self.k * step_s)
        return (
            f"K={self.k} steps per compiled call (measured: {step_s * 1e3:.3f} ms per step, "
            f"{overhead_s * 1e3:.3f} ms per call = {share:.1%} overhead at K={self.k}{kept})"
        )

    @staticmethod
    def why_probe() -> str:
        return "timing probe of the automatic K"

    def why(self, k: int) -> str:
        """Why a call of k steps runs: the cause of compiling its program."""
        if self.measuring:
            return self.why_probe()
        if k == self.k and self.slowed:
            return f"the run's K, K_a: a call of {self.slowed[0]} steps took {self.slowed[1]:.1f} s"
        if k == self.k:
            return "the run's K, " + ("set" if self.fixed else "measured" if self.fitted else
                                      "automatic (a run too short for measuring K to pay)" if self.short else
                                      "automatic (epochs too short to measure it)")
        if k == self._remaining:
            return f"last call of the epoch: the {k} steps left after calls of K={self.k}"
        return f"a call of {k} steps"

    def why_slowed(self) -> str:
        """What K_b's program was for, once its first call's time switched K to K_a (`check`)."""
        steps, seconds = self.slowed or (0, 0.0)  # set by `check`, which this follows
        return (f"a short run's K_b, until its first call ({steps} steps) took {seconds:.1f} s; K={self.k} from then "
                "on")


class StepForm:
    """Chooses the form of the run's calls: "scan" (K steps fused in a rolled `lax.scan`),
    "unroll" (programs of U fully unrolled steps, dispatched K/U times) or "step" (the plain
    step, dispatched K times).

    A form set by the user is used as is. Otherwise ("auto") a decision kept by an earlier run of
    the same program on the same machine is reused (`reuse`; `form_memory`), and only without one
    are the steps of the run's first call timed in each form before it runs, on a copy of the state
    that is then dropped (see `calls.CompiledCalls.calibrate`): the plain step, then the scan
    program masked to the same steps, interleaved, three and two timings, with a host sync after
    each segment. Each program first runs once untimed (a first run pays one-off costs: 39 ms
    against 2.4 ms for mlp-regression's step). The scan program is longer than the segment (K_b's,
    or the run's K), and its skipped steps and the call itself cost time too: a call of it that
    skips every step is timed (`call_s`) and taken off the segment's time, so that the loop's figure
    is per step, as the plain step's and the K chooser's are. A segment holds `form_probe_s` over
    the first (warm) step's time steps (1 to K_a; see `segment`), so a model whose loop body is slow
    pays that slowness for a step or two, not for a call of K; one timing of each decides when they
    are 3x apart and the scan's took over `DECISIVE_S`. When the plain step is faster than the loop,
    programs of U unrolled steps are timed too, interleaved with the plain step again, and kept
    when clearly faster (`UNROLL_MARGIN`: they hold more temporaries).

    The forms round differently (XLA fuses a loop body and straight-line code apart), so a run's
    numbers depend on the form: one form replaces another only when its slowest timing beats the
    other's fastest by the margin, in timings interleaved so that a load that comes or goes while
    they are taken slows both forms' timings, never one form's alone: a machine's load lengthens
    timings, so a form whose every timing wins by the margin is faster, not luckier. Where a
    model's loop body is slow it is several times slower (convolutions on XLA:CPU: 10-15x); where
    it is not, the scan's per-call cost is made negligible by K. A load can still rank the forms
    otherwise (measured: the scan 20x slower per step than the plain step under two busy processes
    on 2 cores), so runs of one program on one machine reuse the first run's decision, kept
    (`form_memory`), and compute bit for bit alike whatever the load; `step_form` pins the form.
    """

    LOOP_MARGIN = 2 / 3  # the plain step's per-step time must be under this fraction of the loop's
    UNROLL_MARGIN = 0.8  # the unrolled program's, under this fraction of the plain step's
    DECISIVE_S = 0.2  # a timed segment this long is not a scheduler's hiccup

    def __init__(self, fixed: str = "auto", auto: AutoSteps = AutoSteps()):
        if fixed not in FORMS:
            raise ConfigError(f"step_form={fixed!r} must be one of {', '.join(FORMS)}")
        self.fixed = fixed != "auto"
        self.form = "scan" if fixed == "auto" else fixed
        self.unroll = auto.unroll
        self.per_step: dict[str, float] = {}  # the fastest seconds per step timed in each form
        self.call_s: float | None = None  # the scan program's time for a call that skips every step
        self._slowest: dict[str, float] = {}  # and the slowest: a form replaces another only if its slowest wins
        self._timings: dict[str, int] = {}  # timings taken of each form
        # interleaved: a load that comes or goes slows both forms' timings (the first step's sets the segments)
        self._plan: list[str] = [] if self.fixed else ["step", "step", "scan", "step", "scan"]
        self._probe_s, self._max_steps = auto.form_probe_s, auto.probe_lengths[0]
        self.steps = 1  # steps of a timed segment (the first is one step: it sets the rest)
        self._sized = False  # whether the first step's timing has set `steps`
        self.why = "set" if self.fixed else "not measured yet"
        self.decided = "set" if self.fixed else "not measured"  # or "measured", or "reused" (a kept decision)

    @property
    def measuring(self) -> bool:
        return bool(self._plan)

    def next_form(self) -> str:
        return self._plan[0]

    def segment(self, probe: str, k: int) -> int:
        """Steps of the next timed segment in `probe`'s form, in a call of k steps: `steps`, or U
        for the unrolled program. The loop's segment holds at least the steps whose time (at the
        plain step's rate) matches the loop's `call_s` (up to K_a), so that what is left once that
        is taken off stands above the timings' noise."""
        if probe == "unroll":
            return min(self.unroll, k)
        n = self.steps
        if probe == "scan" and self.call_s and self.per_step.get("step"):
            n = max(n, min(self._max_steps, round(self.call_s / self.per_step["step"])))
        return min(n, k)

    @property
    def dispatched(self) -> bool:
        """Whether calls are dispatched step by step (or U steps at a time) rather than scanned."""
        return self.form != "scan"

    def keep(self, why: str) -> None:
        """Not measured, for `why`: the scan stays."""
        self._plan, self.why = [], why
        self.decided = "not measured"

    def stop(self) -> None:
        """Measuring is over without a decision (a run too short for it): the current form stays."""
        if self._plan:
            self._plan, self.why = [], "measuring cut short: " + self._figures()

    def record(self, form: str, steps: int, seconds: float) -> str | None:
        """Takes the time of a segment of `steps` steps in `form`; at the end of the plan picks the
        form and returns why (None before)."""
        per_step = seconds / steps
        self.per_step[form] = min(self.per_step.get(form, math.inf), per_step)
        self._slowest[form] = max(self._slowest.get(form, 0.0), per_step)
        self._plan.pop(0)
        self._timings[form] = self._timings.get(form, 0) + 1
        if form == "step" and not self._sized:  # the first step: sets the segments
            self.steps, self._sized = max(1, min(self._max_steps, round(self._probe_s / per_step))), True
        if form == "scan" and self._timings["scan"] == 1 and seconds > self.DECISIVE_S:  # one timing is
            ratio = per_step / self.per_step["step"]  # enough when far apart and too long to be noise
            if ratio > 3 or ratio < 1 / 3:
                self._plan = []
        if self._plan:
            return None
        timed, slowest = self.per_step, self._slowest
        if "unroll" not in timed:
            if slowest["step"] < self.LOOP_MARGIN * timed["scan"]:  # the step's every timing beats the loop's best
                self.form, self._plan = "step", ["unroll", "step", "unroll"]  # try U unrolled, interleaved
                return None
            self.form = "scan"
        else:
            self.form = "unroll" if slowest["unroll"] < self.UNROLL_MARGIN * timed["step"] else "step"
        self.why, self.decided = f"measured: {self._figures()}", "measured"
        return f"{self.describe()} ({self.why})"

    def decision(self) -> dict[str, Any]:
        """What `form_memory` keeps of a measured decision, for `reuse`."""
        return {"form": self.form, "why": self.why, "ms_per_step": self.summary()["ms_per_step"],
                **({"loop_ms_per_call": self._call_ms()} if self.call_s is not None else {})}

    def reuse(self, decision: dict[str, Any]) -> str:
        """Takes the decision an earlier run of the same program on this machine measured (`decision`)
        instead of timing the forms; returns the run's message."""
        self._plan, self.form, self.decided = [], decision["form"], "reused"
        self.per_step = {f: t / 1e3 for f, t in decision["ms_per_step"].items()}
        if "loop_ms_per_call" in decision:
            self.call_s = decision["loop_ms_per_call"] / 1e3
        measured = decision["why"].removeprefix("measured: ")
        self.why = f"reused: measured by an earlier run of this program on this machine, {measured}"
        return f"{self.describe()} ({self.why})"

    @property
    def loop_slower(self) -> bool:
        """Whether the loop was timed slower per step than the plain step."""
        return not self.measuring and self.per_step.get("scan", 0.0) > self.per_step.get("step", math.inf)

    def blame(self, ops: str | None) -> str:
        """Adds the step's ops known to be slow in a loop body to `why`; the decision's message."""
        if ops:
            self.why += f"; the step holds {ops}, which XLA:CPU runs slower in a loop body"
        return f"{self.describe()} ({self.why})"

    def _figures(self) -> str:
        names = {"scan": "loop", "step": "plain step", "unroll": f"{self.unroll} unrolled"}
        call = f" + {self._call_ms():.3g} ms per call" if self.call_s is not None else ""
        ms = lambda t: f"{t * 1e3:.3g}" if t >= 1e-6 else "<0.001"  # noqa: E731 - steps lost in the call's noise
        return ", ".join(f"{names[f]} {ms(t)} ms/step" + (call if f == "scan" else "")
                         for f, t in sorted(self.per_step.items(), key=lambda item: item[1]))

    def describe(self) -> str:
        return {"scan": "steps fused in a lax.scan loop",
                "unroll": f"programs of {self.unroll} unrolled steps, dispatched without a host sync",
                "step": "the plain step, dispatched without a host sync"}[self.form]

    def summary(self) -> dict[str, Any]:
        """What summary.json records of the choice."""
        return {"form": self.form, "why": self.why, "decided": self.decided, "unroll": self.unroll,
                "ms_per_step": {f: float(f"{t * 1e3:.5g}") for f, t in self.per_step.items()},  # small stays > 0
                **({"loop_ms_per_call": self._call_ms()} if self.call_s is not None else {})}

    def _call_ms(self) -> float:
        """The loop's fixed time per call in ms, as recorded: the message shows this number, not the
        unrounded one (0.68650 and 0.686504 round to different third digits)."""
        return round((self.call_s or 0.0) * 1e3, 4)



FORM_PROBE = "timing probe of the step's form"  # why a dispatched program compiled while the form is timed
