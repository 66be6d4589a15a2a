"""Pure step builders: one training step, K fused steps, and a full evaluation pass.

Everything here is traced once and compiled; nothing logs, reads the clock or syncs with the
host. Static choices (batch size, K) are bound before `jax.jit`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxtrain._src import metrics as metrics_lib
from jaxtrain._src.precision import Policy, current_scale
from jaxtrain._src.state import TrainState, split_params

Batch = Any  # a pytree of arrays with a leading batch axis
Metrics = dict[str, jax.Array]
LossFn = Callable[[nnx.Module, Batch, jax.Array], tuple[jax.Array, Metrics]]
LearningRate = Callable[[optax.OptState, jax.Array], jax.Array]  # (updated optimizer state, step) -> lr
Preprocess = Callable[[Batch], Batch]
Augment = Callable[[Batch, jax.Array], Batch]

_EVAL_KEY_SALT = 0x5EED  # evaluation keys come from a stream disjoint from training steps


def make_train_step(
    graphdef: nnx.GraphDef,
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    preprocess: Preprocess | None = None,
    augment: Augment | None = None,
    learning_rate: LearningRate | None = None,
    gather_params: Callable[[nnx.State], nnx.State] | None = None,
    split_grads: Callable[[nnx.State], nnx.State] | None = None,
    policy: Policy = Policy(),
    grad_accum: int = 1,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """Builds `train_step(state, batch) -> (state, metrics)`: one optimizer step.

    The step key is `fold_in(state.rng, state.step)`, split between `augment` and `loss_fn`.
    `metrics` holds `loss`, whatever `loss_fn` returned as its second output, and `lr`, the
    learning rate of this update, when `learning_rate` is given (see `optim.learning_rate_fn`).
    `gather_params` places the parameters where the model uses them and `split_grads` places the
    gradients (FSDP: gathered whole, then reduced back to each device's split).

    `policy` casts the floating parameters and inputs to its compute dtype inside the step (the
    state stays float32); with fp16, `tx` must be `policy.wrap(tx)`: the loss is multiplied by the
    scale the optimizer state holds, the gradients divided by it, and `loss_scale` and
    `scale_skips` (updates skipped so far) join the metrics. With `grad_accum` N the batch holds
    N micro-batches (rows j, j+N, j+2N, ... form micro-batch j, so a batch split over devices
    stays split); their gradients and metrics are averaged by a scan, so memory is one micro-batch's.
    Micro-batch j's key is `fold_in(step key, j)`.

    The update gets the step's loss as `value` (optax's extra arguments), so that transforms which
    need it, such as `optax.contrib.reduce_on_plateau`, work inside `tx`; others ignore it.
    """
    tx = optax.with_extra_args_support(tx)

    def micro_step(params: nnx.State, model_state: nnx.State, batch: Batch, key: jax.Array, scale: jax.Array):
        """Gradients of one (micro-)batch: `((loss, metrics), model_state, grads)`, grads scaled."""
        augment_key, loss_key = jax.random.split(key)
        batch = policy.cast(loss_input(batch, augment_key, preprocess, augment))

        def objective(params: nnx.State) -> tuple[jax.Array, tuple[jax.Array, Metrics, nnx.State]]:
            params = policy.cast(params)
            if gather_params is not None:
                params = gather_params(params)
            model = nnx.merge(graphdef, params, model_state, copy=True)  # fresh Variables in this trace
            loss, metrics = loss_fn(model, batch, loss_key)
            loss = loss.astype(jnp.float32)
            new_model_state = split_params(model)[2]  # e.g. updated batch-norm stats
            new_model_state = jax.tree.map(_same_dtype, new_model_state, model_state)  # statistics stay float32
            metrics = metrics_lib.as_float32(metrics)
            return loss * scale, (loss, metrics, new_model_state)

        (_, (loss, metrics, model_state)), grads = jax.value_and_grad(objective, has_aux=True)(params)
        return (loss, metrics), model_state, grads

    def accumulate(params: nnx.State, model_state: nnx.State, batch: Batch, key: jax.Array, scale: jax.Array):
        """`micro_step` over the batch's `grad_accum` micro-batches, averaged."""
        micro = jax.tree.map(lambda x: x.reshape(x.shape[0] // grad_accum, grad_accum, *x.shape[1:]).swapaxes(0, 1),
                             batch)  # (N, B, ...): micro-batch j is rows j, j+N, ...

        def body(carry, xs):
            model_state, grad_sum = carry
            j, mb = xs
            out, model_state, grads = micro_step(params, model_state, mb, jax.random.fold_in(key, j), scale)
            return (model_state, jax.tree.map(jnp.add, grad_sum, grads)), out

        zeros = jax.tree.map(jnp.zeros_like, params)
        (model_state, grad_sum), outs = jax.lax.scan(body, (model_state, zeros), (jnp.arange(grad_accum), micro))
        loss, metrics = outs  # a Stat's counts add up over the micro-batches, batch means average
        return (loss.mean(axis=0), metrics_lib.mean_micro(metrics)), model_state, jax.tree.map(lambda g: g / grad_accum,
                                                                                        grad_sum)

    gradients = micro_step if grad_accum == 1 else accumulate

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        key = jax.random.fold_in(state.rng, state.step)
        scale = current_scale(state.opt_state)
        (loss, metrics), model_state, grads = gradients(
            state.params, state.model_state, batch, key, jnp.float32(1.0) if scale is None else scale)
        if scale is not None:
            grads = jax.tree.map(lambda g: g / scale, grads)
        if split_grads is not None:
            grads = split_grads(grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params, value=loss)
        params = optax.apply_updates(state.params, updates)
        new_state = TrainState(state.step + 1, params, model_state, opt_state, state.rng)
        if learning_rate is not None:
            metrics = {**metrics, "lr": learning_rate(opt_state, state.step)}
        if scale is not None:
            metrics = {**metrics, "loss_scale": opt_state.scale, "scale_skips": opt_state.skipped}
        return new_state, {"loss": loss, **metrics}

    return train_step


def loss_input(batch: Batch, key: jax.Array, preprocess: Preprocess | None = None,
               augment: Augment | None = None) -> Batch:
    """What a training step's loss receives of `batch` (before the precision cast): `preprocess`,
    then `augment` with `key`. The program builder traces the loss on it (`rewrite.rewrite_loss`)."""
    if preprocess is not None:
        batch = preprocess(batch)
    if augment is not None:
        batch = augment(batch, key)
    return batch


def _same_dtype(new: jax.Array, old: jax.Array) -> jax.Array:
    return new.astype(old.dtype) if jnp.issubdtype(old.dtype, jnp.floating) else new


def make_eval_step(
    graphdef: nnx.GraphDef, loss_fn: LossFn, preprocess: Preprocess | None = None, policy: Policy = Policy()
) -> Callable[[TrainState, Batch], Metrics]:
    """Builds `eval_step(state, batch) -> metrics`, the batch means of `loss` and `loss_fn`'s metrics
    (float32), computed in `policy`'s dtype as training is.

    Pass the graph definition of the model in evaluation mode (`jaxtrain.state.eval_graphdef`).
    """

    def eval_step(state: TrainState, batch: Batch) -> Metrics:
        if preprocess is not None:
            batch = preprocess(batch)
        model = nnx.merge(graphdef, policy.cast(state.params), state.model_state, copy=True)
        key = jax.random.fold_in(state.rng, _EVAL_KEY_SALT)
        loss, metrics = loss_fn(model, policy.cast(batch), key)
        return metrics_lib.as_float32({"loss": loss, **metrics})

    return eval_step


def gather_batch(data: Batch, indices: jax.Array) -> Batch:
    """Rows `indices` (shape (B,)) of every array in `data`."""
    return jax.tree.map(lambda x: jnp.take(x, indices, axis=0), data)


StepAt = Callable[..., tuple[TrainState, Metrics]]  # step_at(state, *call_args, i): step i of a call


def make_gather_step(
    train_step: Callable[[TrainState, Batch], tuple[TrainState, Metrics]],
    batch_size: int,
    constrain: Callable[[Batch], Batch] | None = None,
) -> StepAt:
    """Step `i` of a call over device-resident data: `step_at(state, data, perm, start, i)` trains
    on rows `perm[(start+i)*B : (start+i+1)*B]` of `data`, gathered on the device. `constrain(batch)`
    places each gathered batch (e.g. split over a mesh's devices)."""

    def step_at(state: TrainState, data: Batch, perm: jax.Array, start: jax.Array, i: jax.Array):
        indices = jax.lax.dynamic_slice_in_dim(perm, (start + i) * batch_size, batch_size)  # (B,)
        batch = gather_batch(data, indices)
        return train_step(state, constrain(batch) if constrain is not None else batch)

    return step_at


def make_stacked_step(train_step: Callable[[TrainState, Batch], tuple[TrainState, Metrics]]) -> StepAt:
    """Step `i` of a call over batches that arrive stacked (streamed data): `step_at(state,
    batches, i)` trains on `batches[i]`, `batches` of shape (K, B, ...)."""

    def step_at(state: TrainState, batches: Batch, i: jax.Array):
        return train_step(state, jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), batches))

    return step_at


def fuse_steps(step_at: StepAt, num_steps: int, unroll: bool = False) -> Callable[..., tuple[TrainState, Metrics]]:
    """`call(state, *args, first)`: steps `first .. first+K-1` of a call, K = `num_steps`, fused
    with `lax.scan`, or with `unroll` traced one after another: straight-line code with no loop
    body (a scan of one step, even `unroll=True`, still compiles to a while loop). Returns the new
    state and each metric stacked to shape (K,)."""

    def call(state: TrainState, *args: Any):
        *inputs, first = args
        if not unroll:
            return jax.lax.scan(lambda state, i: step_at(state, *inputs, first + i), state, jnp.arange(num_steps))
        metrics = []
        for i in range(num_steps):
            state, m = step_at(state, *inputs, first + i)
            metrics.append(m)
        return state, jax.tree.map(lambda *m: jnp.stack(m), *metrics)

    return call


def make_multi_step(
    train_step: Callable[[TrainState, Batch], tuple[TrainState, Metrics]],
    batch_size: int,
    num_steps: int,
    constrain: Callable[[Batch], Batch] | None = None,
) -> Callable[[TrainState, Batch, jax.Array, jax.Array], tuple[TrainState, Metrics]]:
    """Fuses `num_steps` (K) training steps into one function over device-resident data.

    `multi_step(state, data, perm, start)` runs steps `start .. start+K-1` of the epoch whose
    sample order is `perm` (see `make_gather_step`). Returns the new state and each metric stacked
    to shape (K,).
    """
    call = fuse_steps(make_gather_step(train_step, batch_size, constrain), num_steps)
    return lambda state, data, perm, start: call(state, data, perm, start, jnp.int32(0))


def make_evaluate_sums(
    eval_step: Callable[[TrainState, Batch], Metrics], num_samples: int, batch_size: int,
    constrain: Callable[[Batch], Batch] | None = None,
) -> Callable[[TrainState, Batch], Metrics]:
    """`evaluate_sums(state, data) -> sums`: each metric summed over all `num_samples` rows of `data`
    (the full batches' means added up, then times the batch size; the remainder's mean times its rows).

    Full batches run under `lax.map` (a scan), each placed by `constrain` when given (e.g. split
    over a mesh's devices); the remainder runs as one smaller batch, so no sample is dropped or
    counted twice.
    """
    place = constrain or (lambda batch: batch)
    num_full, remainder = divmod(num_samples, batch_size)

    def evaluate_sums(state: TrainState, data: Batch) -> Metrics:
        totals: Metrics | None = None
        if num_full:
            full = jax.tree.map(lambda x: x[: num_full * batch_size].reshape(num_full, batch_size, *x.shape[1:]), data)
            per_batch = jax.lax.map(lambda batch: eval_step(state, place(batch)), full)  # each metric (num_full,)
            # the batch means added, then times the batch size: the order (and bits) of runs before Stats
            totals = metrics_lib.row_sums(metrics_lib.total(per_batch), batch_size)
        if remainder:
            tail = jax.tree.map(lambda x: x[num_full * batch_size :], data)
            tail_totals = metrics_lib.row_sums(eval_step(state, tail), remainder)
            totals = tail_totals if totals is None else metrics_lib.add(totals, tail_totals)
        assert totals is not None, "evaluation data has rows (checked before the run)"
        return totals

    return evaluate_sums


def make_batch_sums(
    eval_step: Callable[[TrainState, Batch], Metrics], batch_size: int,
    constrain: Callable[[Batch], Batch] | None = None,
) -> Callable[[TrainState, Batch, jax.Array, Metrics], Metrics]:
    """`batch_sums(state, data, i, sums) -> sums`: `sums` plus each metric summed over the rows of
    batch i of `data` (full batches only): evaluation dispatched batch by batch, with no loop body
    (see `choosers.StepForm`); `sums` is donated between the dispatches."""
    place = constrain or (lambda batch: batch)

    def batch_sums(state: TrainState, data: Batch, i: jax.Array, sums: Metrics) -> Metrics:
        batch = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, i * batch_size, batch_size), data)
        return metrics_lib.add(sums, metrics_lib.row_sums(eval_step(state, place(batch)), batch_size))

    return batch_sums


def make_evaluate(
    eval_step: Callable[[TrainState, Batch], Metrics], num_samples: int, batch_size: int
) -> Callable[[TrainState, Batch], Metrics]:
    """`evaluate(state, data) -> metrics`: exact means over all `num_samples` rows of `data`
    (`make_evaluate_sums` divided by `num_samples`)."""
    evaluate_sums = make_evaluate_sums(eval_step, num_samples, batch_size)
    return lambda state, data: metrics_lib.compute_traced(evaluate_sums(state, data), num_samples)
