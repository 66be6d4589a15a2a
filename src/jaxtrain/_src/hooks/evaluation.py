"""Evaluation on the validation set at the end of every `eval_every`-th epoch (and the last).

Validation data on the device run as one compiled call: full batches under `lax.map`, plus one
call of the remainder; or, when training dispatches its steps rather than looping over them (the
model's ops are slow in a loop body: `choosers.StepForm`), batch by batch, dispatched without a host
sync, the sums added up on the device. The program is compiled in the background once the form is
chosen: beside the first training call's compile when the form needs no timing (a set form, a brief
run), else after the first call. Validation data streamed from a row source (when they exceed what the
training data leave of the memory budget) are read in blocks of whole batches by a background
thread; each block runs one compiled call and the sums are added up on the host in float64.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np

from jaxtrain._src import data as data_lib
from jaxtrain._src import metrics as metrics_lib
from jaxtrain._src.compiling import shapes_of
from jaxtrain._src.data.adapters import BatchStream
from jaxtrain._src.data.stream import BackgroundIterator
from jaxtrain._src.feeds import stream_blocks
from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.moments import announce
from jaxtrain._src.optim import ema_params
from jaxtrain._src.step import make_batch_sums, make_evaluate_sums

STREAM_BLOCK_BYTES = 32 << 20  # rows per streamed evaluation call: about this many bytes, whole batches


class EvalHook(RunHook):
    """Adds `val_loss` and `val_<metric>` (exact means over every validation sample; a metric the
    loss returns as a `jaxtrain.metrics` Stat, such as F1, computed from its counts over them all), `eval_time_s`
    and the evaluation's share of `epoch_time_s` to the epoch record; with an average of the
    weights (`TrainConfig.ema`), `val_ema_loss` and `val_ema_<metric>` of it too.

    Args:
      eval_step: the program's pure evaluation step (evaluation mode, the training dtype).
      data: a pytree of arrays, or a `(row source, treedef)` pair when `streamed`.
      streamed: evaluate from the row source in blocks instead of holding the data on the device.
      batch_size: evaluation batch size (capped at the number of samples).
      every: evaluate every this many epochs; the last epoch always.
    """

    def __init__(self, eval_step: Callable, data: Any, streamed: bool, batch_size: int, every: int):
        self._step = eval_step
        self._data, self._streamed, self._every = data, streamed, every
        if isinstance(data, BatchStream):  # a loader's batches: its samples counted once here
            self.num_samples = data.rows_per_epoch()
        else:
            self.num_samples = len(data[0]) if streamed else data_lib.num_samples(data, "val_data")
        self._B = min(batch_size, self.num_samples)
        self._evaluate: Callable[[Any], dict[str, float]] | None = None

    def on_start(self, run: Run) -> None:
        if self._streamed:
            self._evaluate = self._build_streamed(run)

    def before_compile(self, run: Run) -> None:
        if self._evaluate is None and not self._streamed and not run.calls.form.measuring:  # the form is settled:
            self._evaluate = self._build_on_device(run)  # compiled beside the training call, not after it

    def after_call(self, run: Run, k: int, metrics: dict[str, jax.Array]) -> None:
        if self._evaluate is None:  # the first call chose the form: compiled meanwhile, used after an epoch
            self._evaluate = self._build_on_device(run)

    def _place(self, run: Run, host: Any) -> Any:
        """Host arrays replicated on every device of the run's mesh."""
        host = jax.tree.map(np.asarray, host)
        return run.layout.put(host, jax.tree.map(lambda x: run.layout.replicated, host))

    def _constrain(self, run: Run, batch_size: int) -> Callable | None:
        """Splits evaluation batches over the devices when they divide evenly (else each device
        evaluates the whole batch)."""
        return run.layout.constrain_batch if batch_size % run.layout.num_devices == 0 else None

    def _build_on_device(self, run: Run) -> Callable:
        data = self._place(run, self._data)
        n, B = self.num_samples, self._B
        constrain = self._constrain(run, B)
        if not run.calls.form.dispatched:
            fn = make_evaluate_sums(self._step, n, B, constrain)
            sums = run.calls.compile(fn, shapes_of(run.state), data, background=True)
            return lambda state: metrics_lib.compute(sums(state, data), n)
        num_full, remainder = divmod(n, B)
        zeros = metrics_lib.widen(jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), jax.eval_shape(
            self._step, run.state, jax.tree.map(lambda x: jax.ShapeDtypeStruct((B, *x.shape[1:]), x.dtype), data))))
        index = np.int32(0)
        batch = run.calls.compile(make_batch_sums(self._step, B, constrain), shapes_of(run.state), data, index, zeros,
                                  background=True)
        tail = None
        if remainder:  # the last rows as one smaller batch, as the loop's evaluation does
            rest = jax.tree.map(lambda x: x[num_full * B:], data)
            tail = run.calls.compile(make_batch_sums(self._step, remainder, self._constrain(run, remainder)),
                                     shapes_of(run.state), rest, index, zeros, background=True)

        def evaluate(state: Any) -> dict[str, float]:
            sums = self._place(run, zeros)
            for i in range(num_full):
                sums = batch(state, data, np.int32(i), sums)
            if tail is not None:
                sums = tail(state, rest, index, sums)
            return metrics_lib.compute(sums, n)

        return evaluate

    def _build_streamed(self, run: Run) -> Callable:
        n, B = self.num_samples, self._B
        if isinstance(self._data, BatchStream):  # each of the loader's batches is a block
            stream = self._data
            treedef, names = stream.treedef, stream.names

            def read(put: Callable[[dict], None]) -> None:
                for batch, _ in stream.batches(1):
                    put(batch)

            blocks = lambda: BackgroundIterator(read, 4, name="jaxtrain-eval-iter")  # noqa: E731
        else:
            source, treedef = self._data
            rows = B * max(1, STREAM_BLOCK_BYTES // (B * max(1, source.row_nbytes)))  # whole batches per call
            rows = min(rows, n - n % B) or n
            names = list(source.read(0, 1))
            blocks = lambda: stream_blocks(source, rows)  # noqa: E731

        def as_batch(block: dict) -> Any:
            return block if treedef is None else jax.tree.unflatten(treedef, [block[k] for k in names])

        programs: dict[int, Callable] = {}

        def program(size: int, state: Any, example: Any) -> Callable:
            if size not in programs:
                fn = make_evaluate_sums(self._step, size, min(B, size), self._constrain(run, min(B, size)))
                programs[size] = run.calls.compile(fn, shapes_of(state), shapes_of(example))
            return programs[size]

        def evaluate(state: Any) -> dict[str, float]:
            totals: dict[str, Any] | None = None  # added up on the host in float64
            with blocks() as iterator:
                for block in iterator:
                    batch = as_batch(self._place(run, block))
                    size = len(next(iter(block.values())))
                    sums = metrics_lib.host_sums(program(size, state, batch)(state, batch))
                    totals = sums if totals is None else metrics_lib.add(totals, sums)
            assert totals is not None, "validation data have rows (checked before the run)"
            return metrics_lib.compute(totals, n)

        return evaluate

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        if run.epoch % self._every and run.epoch != run.last_epoch:
            return
        assert self._evaluate is not None  # built in on_start or after the first call
        evaluate = self._evaluate
        t0 = time.perf_counter()
        announce("evaluation", when="before", epoch=run.epoch)
        record.update({f"val_{k}": v for k, v in evaluate(run.state).items()})
        ema = ema_params(run.state.opt_state)
        if ema is not None:  # the average of the weights, evaluated beside them
            averaged = run.state._replace(params=jax.tree.map(lambda e, p: e.astype(p.dtype), ema, run.state.params))
            record.update({f"val_ema_{k}": v for k, v in evaluate(averaged).items()})
        announce("evaluation", when="after", epoch=run.epoch)
        eval_s = time.perf_counter() - t0
        record["eval_time_s"] = record.get("eval_time_s", 0.0) + eval_s
        record["epoch_time_s"] = record.get("epoch_time_s", 0.0) + eval_s
