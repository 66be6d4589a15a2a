"""Compiled calls: dispatching a run's calls of K optimizer steps, and timing its first ones to choose K and the form.

A call runs K optimizer steps; the feed says what the call takes besides the train state (device
data and a permutation, or stacked streamed batches) and what step i of it is (`Feed.make_step`).
The call has one of three forms (`choosers.StepForm`): the K steps fused with `lax.scan` (one
program per K, one dispatch), programs of U fully unrolled steps dispatched K/U times, or the
plain step dispatched K times; the dispatched forms queue their programs without a host sync in
between. XLA:CPU runs some ops (convolutions) many times slower inside a loop body than in
straight-line code (jax#12868), so the form is measured on the run's own first steps, not assumed.

`CompiledCalls.__call__` is the dispatch path: which program serves a call (an epoch's shorter
last call runs the program of K with its extra steps skipped, `compiling.masked_call`, so a run
over device-resident data compiles one program for K), handing it to the device, no host sync.
`CompiledCalls.calibrate` is the calibration: `training.train` runs the run's first calls through
it while `calibrating`. The first one's steps are timed in each form on a copy of the state (the
form chosen, nothing trained); then those calls, real training steps, are timed one by one for the
K chooser (`choosers.StepsPerCall`). The programs are compiled by the run's compile service
(`compiling.Compiler`: ahead of time, with the run's shardings, the state donated, compile time
kept out of epoch times, some in the background) and cached (`compiling.TrainPrograms`).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.choosers import FORM_PROBE, StepForm, StepsPerCall
from jaxtrain._src.compiling import CallSource, Compiler, Compiling, TrainPrograms
from jaxtrain._src.form_memory import FormMemory
from jaxtrain._src.probes import CallOverhead, flops_of, loop_body_counted_once
from jaxtrain._src.sharding import Layout
from jaxtrain._src.state import TrainState
from jaxtrain._src.step import Metrics

__all__ = ["CompiledCalls"]


class CompiledCalls:
    """The compiled K-step calls of a run, compiled ahead of time on first use, with donation.

    `calls(k, state, args)` runs one call of k steps in the form `form` chose and returns
    `(state, metrics)` with each metric stacked to shape (k,), asynchronously. While the form or
    K is being chosen (`calibrating`), the run's calls go through `calibrate` instead, which times them.

    Args:
      source: the feed, which builds the function of a call and describes its arguments.
      train_step: the pure `train_step(state, batch) -> (state, metrics)`.
      state: a train state (or its shapes) to compile for.
      chooser: the K chooser.
      layout: the mesh and shardings of the run (the state is split as `layout.state_shardings`).
      log: where the choosers' decisions are reported.
      state_shardings: `layout.state_shardings(state)`, when the caller has it already.
      form: the form chooser (default: the scan, as set).
      rewrites: what of the loss was rewritten for XLA:CPU (`Program.rewrites`), for the reports.
      loss_clean: the loss is known to hold no loop-slow op (`Program.loss_clean`): no step is traced
        to look for one.
      memory: where form decisions are kept (`decisions`) between runs (`form_memory`): an "auto" form reuses the
        decision an earlier run of the same program measured on this machine, and keeps its own.
    """

    clock: Callable[[], float] = staticmethod(time.perf_counter)  # times the forms' segments (tests load it)

    def __init__(self, source: CallSource, train_step: Callable, state: TrainState, chooser: StepsPerCall,
                 layout: Layout, log: Callable[[str], None] = lambda message: None, state_shardings: Any = None,
                 form: StepForm | None = None, rewrites: str | None = None, loss_clean: bool = False,
                 memory: FormMemory | None = None):
        self.source, self.train_step, self.chooser, self.layout, self.log = source, train_step, chooser, layout, log
        self.form = form if form is not None else StepForm("scan")
        self.rewrites, self.loss_clean = rewrites, loss_clean
        self.state_shardings = state_shardings if state_shardings is not None else layout.state_shardings(state)
        self.compiler = Compiler(layout)
        self.programs = TrainPrograms(self.compiler, source, train_step, state, self.state_shardings)
        self.decisions = memory if self.form.measuring else None
        self._indices: dict[int, jax.Array] = {}
        self._slow: dict[int, str | None] = {}  # k -> the step's loop-slow ops (`_slow_ops`)
        self._recalled: dict[str, Any] = {}  # a decision key -> the kept decision (`_kept`)
        self.dispatch_s = 0.0  # host seconds handing calls to the device (compilation not included)
        self.longest = 0  # the most steps a call of the run ran
        self.wait_s = 0.0  # host seconds waiting for calls to finish: the device computing
        self.overhead = CallOverhead()  # the profile's probe of a call's fixed cost, shared by whoever calls these

    @property
    def k(self) -> int:
        """The K in use (the measured choice once measuring is over)."""
        return self.chooser.k

    def next_length(self, remaining: int) -> int:
        return self.chooser.next_length(remaining)

    def compile(self, fn: Callable, *args: Any, **options: Any) -> Callable:
        """Compiles `fn` for `args` with the run's compile service (`compiling.Compiler.compile`)."""
        return self.compiler.compile(fn, *args, **options)

    @property
    def compile_s(self) -> float:
        """Seconds the main thread compiled, or waited for a background compile."""
        return self.compiler.compile_s

    @property
    def compiles(self) -> list[dict[str, Any]]:
        """Every program compiled: what, seconds (a training program's: k, why, calls)."""
        return self.compiler.compiles

    @property
    def memory(self) -> dict[str, int] | None:
        """The compiled memory of the first training program (`memory.compiled_memory`)."""
        return self.programs.memory

    def finish_compiles(self) -> None:
        """Waits for every background compile (the wait counts in `compile_s`)."""
        self.compiler.finish()

    def close(self) -> None:
        """Lets background compiles finish and ends their thread."""
        self.compiler.close()

    def start(self, k: int) -> None:
        """Starts compiling the run's first call of k steps: traced and lowered here, compiled in the
        background while this thread does the run's other start-up work (evaluation's trace)."""
        self.get(k, background=True)
        self.compiler.beside(loop_body_counted_once)  # the header's FLOPs need it: probed during the first compile

    def get(self, k: int, background: bool = False) -> Callable:
        """The compiled scan call of k steps (compiled now if it is new): `call(state, *args, first,
        valid)` runs `valid` of its k steps from step `first` of the call's arguments (see
        `masked_call`); a longer program when one serves (`program_length`). With a dispatched
        form it compiles that form's program instead (and returns it). With `background`, a new
        program compiles in the background (`compiling.Compiling`)."""
        form, programs = self.form, self.programs
        if form.dispatched and not form.measuring:
            unrolled = form.unroll if form.form == "unroll" else 1
            program = self._program(unrolled, k, background)
            if unrolled > 1 and k % unrolled:  # the remainder's steps: beside it
                self._program(1, k, background=True)
            return program
        self.settle_form(k)
        programs.fingerprint = form.measuring and self.decisions is not None  # its hash keys the kept decision
        length = self.program_length(k)
        new = length not in programs.calls
        program = programs.scan(length, lambda: self.chooser.why(length), background)
        if form.measuring and not programs.dispatched and self._kept(k) is None:  # timed first: beside the scan
            self._program(1, k, background=True)
        if new:  # the K chooser's other timed length, when it needs a program: in the background
            for other in {self.program_length(n) for n in self.chooser.planned()}:
                programs.scan(other, functools.partial(self.chooser.why, other), background=True)
        return program

    def settle_form(self, k: int) -> None:
        """Settles the form before anything compiles where no timing is needed: a brief run whose
        step holds no op known to be slow in a loop body keeps the scan (so the run's other
        programs, evaluation's, can compile beside its first call's, `RunHook.before_compile`)."""
        form = self.form
        if form.measuring and not self.programs.dispatched and self.chooser.brief and self._slow_ops(k) is None:
            form.keep("a run too short to repay compiling another form, and no op of its step known to be "
                      "slow in a loop body")

    def _program(self, unrolled: int, k: int, background: bool = False) -> Callable:
        """The dispatched program of `unrolled` steps over a call of k steps (`TrainPrograms.steps`)."""
        return self.programs.steps(unrolled, k, self._why_dispatched, background)

    def _why_dispatched(self) -> str:
        return FORM_PROBE if self.form.measuring else f"the run's form ({self.form.why})"

    def _slow_ops(self, k: int) -> str | None:
        """The ops of the step known to be slow in a loop body (`slow_ops.loop_slow_ops`)."""
        if self.loss_clean:  # the program's trace of the loss found none (or rewrote them): a step's trace saved
            return None
        if k not in self._slow:  # asked before compiling (`settle_form`) and again by `get`: traced once
            self._slow[k] = self.programs.slow_ops(k)
        return self._slow[k]

    def _index(self, i: int) -> jax.Array:
        """Step i of a call as an argument on the devices (made once: a host scalar is sent each call)."""
        if i not in self._indices:
            self._indices[i] = jax.device_put(np.int32(i), self.layout.replicated)
        return self._indices[i]

    def _count(self, key: Any) -> None:
        """One more call of the run ran the training program `key` (a program compiled to time the
        form, whose timed segments trained a copy of the state, says that the run's calls ran it)."""
        entry = self.compiler.entries.get(key)
        if entry is None:
            return
        entry["calls"] += 1
        if entry["why"] == FORM_PROBE:
            entry["why"] += f", then the run's form ({self.form.why})"

    def program_length(self, k: int) -> int:
        """The program a call of k steps runs, when the feed's arguments do not depend on the
        call's length (data held on the device), so that one program serves the run:

        - while the K chooser measures, the longest timed length's (K_b): the timed calls of K_a run
          it with their extra steps skipped, so measuring K compiles one program, not two;
        - then K's for a shorter call (an epoch's last, or the rest of the first epoch after the
          timed calls);
        - a K shorter than the programs compiled (the chooser picked K_a) runs the shortest longer
          one, masked, while its own compiles in the background (in a short run, for good)."""
        programs = self.programs
        if self.chooser.measuring:
            probe = max(self.chooser.planned(), default=k)
            return probe if k < probe and programs.same_args(k, probe) else k
        K = self.chooser.k
        length = K if k < K and programs.same_args(k, K) else k
        if not programs.ready(length):
            longer = [n for n in programs.calls if n > length and programs.ready(n) and programs.same_args(length, n)]
            if longer:
                if length not in programs.calls and not self.chooser.short:  # a short run: not worth a compile
                    programs.scan(length, lambda: self.chooser.why(length), background=True)
                return min(longer)
        return length

    @property
    def measuring(self) -> bool:
        """Whether calls are still timed (the form or K being measured)."""
        return self.form.measuring or self.chooser.measuring

    @property
    def calibrating(self) -> bool:
        """Whether the next call goes through `calibrate`: the form or K still measured, or a short
        run's first full call still to be timed (`StepsPerCall.check`)."""
        return self.measuring or self.chooser.checking

    def __call__(self, k: int, state: TrainState, args: tuple[Any, ...]) -> tuple[TrainState, Metrics]:
        if self.form.measuring:
            raise RuntimeError("the calls' form is not chosen yet: the run's first call goes through `calibrate`")
        self.chooser.ran(k)
        self.longest = max(self.longest, k)
        if self.form.dispatched:
            return self._dispatched_call(k, state, args)
        fn, length = self._scan_program(k)
        return self._scan(fn, length, k, state, args)

    def _dispatched_call(self, k: int, state: TrainState, args: tuple[Any, ...]) -> tuple[TrainState, Metrics]:
        """A call in a dispatched form. Its time counts as computing: XLA:CPU runs a program on the
        thread that dispatches it, once the one before is done."""
        t0 = time.perf_counter()
        state, metrics = self._dispatch(self.form.form, k, state, args, 0, k)
        self.wait_s += time.perf_counter() - t0
        unrolled = self.form.unroll if self.form.form == "unroll" else 1
        self._count(("dispatch", self.programs.dispatch_key(unrolled, k)))
        if unrolled > 1 and k % unrolled:  # the remainder's steps ran the plain step
            self._count(("dispatch", self.programs.dispatch_key(1, k)))
        return state, metrics

    def _scan_program(self, k: int) -> tuple[Callable, int]:
        """The scan program a call of k steps runs, and its length (counted as run by the call)."""
        length = self.program_length(k)
        fn = self.get(length)
        self._count(("call", length))
        return fn, length

    def _scan(self, fn: Callable, length: int, k: int, state: TrainState,
              args: tuple[Any, ...]) -> tuple[TrainState, Metrics]:
        """Hands the call of k steps to the device in the program of `length` steps."""
        t0 = time.perf_counter()
        state, metrics = fn(state, *args, np.int32(0), np.int32(k))
        if length != k:  # the steps the call ran; the rest of the program's were skipped
            metrics = jax.tree.map(lambda m: m[:k], metrics)
        self.dispatch_s += time.perf_counter() - t0
        return state, metrics

    def calibrate(self, k: int, state: TrainState, args: tuple[Any, ...]) -> tuple[TrainState, Metrics]:
        """One of the run's first calls (while `calibrating`), timed to choose the form and K.

        Before the run's first call, its steps are timed in each form on a copy of the state
        (`_choose_form`). Then the call itself runs, as `calls(k, state, args)` would, and, while the
        K chooser measures, is timed with nothing compiling beside it and a host sync after it: those
        timed calls are real training steps. A short run's first full call of K_b is timed once too,
        in case its steps are so slow that K_a serves better (`StepsPerCall.check`)."""
        if self.form.measuring:
            self._choose_form(k, state, args)
        chooser = self.chooser
        if self.form.dispatched or not (chooser.measuring or chooser.checking):
            return self(k, state, args)
        chooser.ran(k)
        self.longest = max(self.longest, k)
        fn, length = self._scan_program(k)
        if chooser.measuring:  # timed calls run with nothing compiling beside them
            self.finish_compiles()
        t0 = time.perf_counter()
        state, metrics = self._scan(fn, length, k, state, args)
        entries = self.compiler.entries
        if chooser.checking:  # a short run's first full call: are its steps slow?
            self.wait(metrics)
            if message := chooser.check(k, time.perf_counter() - t0):
                self.log(message)
                if ("call", length) in entries:  # its program was compiled as the run's K: no longer
                    entries[("call", length)]["why"] = chooser.why_slowed()
        if chooser.measuring:  # the first calls of the run are timed one by one
            self.wait(metrics)
            compile_s = max((c["seconds"] for c in self.compiles if c.get("what") == "train call"), default=0.0)
            if message := chooser.record(k, time.perf_counter() - t0, compile_s):
                self.log(message)
                probe = entries.get(("call", self.k))
                if probe is not None and probe["why"] == chooser.why_probe():  # a timed length became K
                    probe["why"] += f", then {chooser.why(self.k)}"
        return state, metrics

    def _choose_form(self, k: int, state: TrainState, args: tuple[Any, ...]) -> None:
        """Chooses the form before the run's first call of k steps: the decision an earlier run of
        this program kept on this machine (`memory`), else timed segments of that call in each form
        (see `StepForm`) run on a copy of the state, which is then dropped, so training starts from
        the same state in the chosen form: results never depend on the timings that chose it, and a
        resumed run (which keeps the form) continues bit for bit. A measured decision is kept."""
        form = self.form
        self.get(k)  # the scan program, and the plain step beside it unless a decision is kept
        if not form.measuring:  # a short run without loop-slow ops (see `get`)
            return
        if (kept := self._kept(k)) is not None:
            self.log(form.reuse(kept))
            if form.dispatched:  # as after measuring: no K to measure
                self.chooser.stop()
            return
        self._time_forms(k, state, args)
        key = self._decision_key(k)
        if self.decisions is not None and key is not None and form.decided == "measured":
            self.decisions.remember(key, form.decision())

    def _decision_key(self, k: int) -> Any:
        """The key of the form decision for the scan program of a call of k steps (its lowered text's hash
        and the unroll): None without a memory or before that program is lowered."""
        program = self.compiler.fingerprints.get(("call", self.program_length(k)))
        return FormMemory.key(program, self.form.unroll) if self.decisions is not None and program else None

    def _kept(self, k: int) -> Any:
        """The form decision an earlier run of this program kept on this machine (`memory`), if any: the
        forms need no timing then, and the plain step no compile (read once: a changed file is one note)."""
        key = self._decision_key(k)
        if self.decisions is None or key is None:
            return None
        found = str(key)
        if found not in self._recalled:
            self._recalled[found] = self.decisions.recall(key)
        return self._recalled[found]

    def _time_forms(self, k: int, state: TrainState, args: tuple[Any, ...]) -> None:
        """Times segments of a call of k steps in each form on a copy of the state, until `form` decides."""
        form = self.form
        scratch = jax.tree.map(lambda x: x.copy(), state)  # the timed programs donate it
        self.wait((scratch, args))  # the timings are the programs' own, not the inputs' arrival
        warm: set[str] = set()

        def run(probe: str, n: int) -> float:  # seconds of a segment of n steps in `probe`'s form
            nonlocal scratch
            t0 = self.clock()
            scratch, metrics = self._dispatch(probe, n, scratch, args, 0, k)
            self.wait((scratch, metrics))
            return self.clock() - t0

        while form.measuring:
            probe = form.next_form()
            unrolled = form.unroll if probe == "unroll" else 1
            n = form.segment(probe, k)
            if n < unrolled:  # calls too short to hold the unrolled program's steps: not compiled
                form.stop()
                break
            if probe != "scan":
                self._program(unrolled, k)
            self.finish_compiles()  # timed segments run with nothing compiling beside them
            if probe not in warm:  # a program's first run pays one-off costs: untimed
                warm.add(probe)
                run(probe, unrolled)  # the scan: one step, then skipped ones (both branches run)
            if probe == "scan" and form.call_s is None:  # the call and its skipped steps, without a step
                form.call_s = min(run("scan", 0) for _ in range(2))
                n = form.segment(probe, k)
            seconds = run(probe, n)
            if probe == "scan":
                seconds = max(seconds - (form.call_s or 0.0), 1e-9)  # steps too cheap to tell from noise: ~0
            if message := form.record(probe, n, seconds):
                if form.loop_slower:  # say which of the step's ops a loop body makes slow
                    message = form.blame(self._slow_ops(k))
                self.log(message)
        del scratch
        if form.dispatched:  # K need not be measured: a dispatched call's cost is its steps'
            self.chooser.stop()

    def _dispatch(self, form: str, n: int, state: TrainState, args: tuple[Any, ...], first: int,
                  k: int) -> tuple[TrainState, Metrics]:
        """Steps `first .. first+n-1` of a call of k steps in `form`, queued without a host sync;
        metrics stacked to shape (n,)."""
        if form == "scan":
            state, metrics = self.get(self.program_length(k))(state, *args, np.int32(first), np.int32(n))
            return state, jax.tree.map(lambda m: m[:n], metrics)
        leaves = self.programs.treedef.flatten_up_to(state)  # type: ignore[attr-defined]  # (not in jax's stubs)
        parts, end = [], first + n
        unrolled = self.form.unroll if form == "unroll" else 1
        while first < end:
            u = unrolled if end - first >= unrolled else 1
            leaves, metrics = self._program(u, k)(leaves, *args, self._index(first))
            parts.append(metrics)
            first += u
        metrics = parts[0] if len(parts) == 1 else jax.tree.map(lambda *m: jnp.concatenate(m), *parts)
        return jax.tree.unflatten(self.programs.treedef, leaves), metrics

    def wait(self, outputs: Any) -> None:
        """Blocks until `outputs` of a call are computed; the seconds are added to `wait_s`."""
        t0 = time.perf_counter()
        jax.block_until_ready(outputs)
        self.wait_s += time.perf_counter() - t0

    def flops_per_step(self, k: int | None = None, grad_accum: int = 1) -> float | None:
        """XLA's FLOP count of one optimizer step, from the compiled call of k steps (see `flops`);
        with k None, from a call already compiled (the run's K when it is, else the longest), so
        that asking compiles nothing. With a dispatched form, from its program (k is not used)."""
        accum = grad_accum if loop_body_counted_once() else 1  # the micro-batches' scan
        programs = self.programs
        if self.form.dispatched and not self.form.measuring and programs.dispatched:
            unrolled = self.form.unroll if self.form.form == "unroll" else 1
            done = [p for (u, _), p in programs.dispatched.items() if u == unrolled and not isinstance(p, Compiling)]
            flops = flops_of(done[0]) if done else None
            return None if flops is None else flops * accum / unrolled
        if k is None:
            ready = [n for n in programs.calls if programs.ready(n)]
            if not ready:
                return None
            k = self.k if self.k in ready else max(ready)
        flops = self.flops(k)
        if flops is None:
            return None
        return flops * grad_accum if loop_body_counted_once() else flops / k

    def flops(self, k: int) -> float | None:
        """XLA's FLOP count of the compiled call of k steps (`cost_analysis`; a loop's body counts
        once), or None when the backend does not report it."""
        return flops_of(self.get(k))
