"""Optax optimizers and schedules built from an `OptimConfig`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxtrain._src.config import OptimConfig, TrainConfig
from jaxtrain._src.precision import LossScaleState, policy_of

VALUES = ("lr", "min_lr", "momentum", "b1", "b2", "eps", "weight_decay", "clip_norm")
"""The numbers of an `OptimConfig` that `with_values` can hold in the optimizer state."""

EXACT_VALUES = ("lr", "min_lr", "momentum", "eps", "weight_decay", "clip_norm")
"""The numbers a value in the state computes with exactly as a constant in the program does. Not
the betas: Adam computes `1 - b2` from them, and in float32 from a held 0.999 that is 1.3e-5 off
the constant `1 - 0.999` rounded once (measured: Adam's weights 6.5e-6 apart after 12 steps)."""


def build_schedule(config: OptimConfig, total_steps: int, values: dict[str, Any] | None = None) -> optax.Schedule:
    """The learning rate as a function of the step.

    `warmup-cosine` rises linearly from 0 to `lr` over `warmup_steps`, then follows
    `min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2` to `min_lr` at `decay_steps`
    (the whole run when 0). `exponential` is `min_lr * (lr / min_lr) ** (step / (decay_steps - 1))`,
    capped at `lr`. `values` (arrays, see `with_values`) replace the config's `lr` and `min_lr`.
    """
    if values is not None and PLANNED in values:
        return fitted_schedule(config, total_steps, values)
    lr, min_lr = (config.lr, config.min_lr) if values is None else (values["lr"], values["min_lr"])
    if config.schedule == "constant":
        return optax.constant_schedule(lr)
    if config.schedule == "exponential":  # min_lr at step 0, lr at decay_steps - 1 (and after)
        steps = max(2, config.decay_steps or total_steps)
        return optax.exponential_decay(min_lr, steps - 1, lr / min_lr, end_value=lr)
    decay_steps = config.decay_steps or total_steps
    decay_steps = max(decay_steps, config.warmup_steps + 1)
    if values is not None:  # optax's own, whose check of the peak in Python a traced rate cannot pass
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, config.warmup_steps),
             optax.cosine_decay_schedule(lr, decay_steps - config.warmup_steps, alpha=min_lr / lr)],
            [config.warmup_steps])
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=lr,
        warmup_steps=config.warmup_steps,
        decay_steps=decay_steps,
        end_value=min_lr,
    )


PLANNED = "planned_steps"
"""The value `with_values(fitted=True)` holds beside the optimizer's numbers: the steps the
learning-rate schedule spans, which a deadline's planner sets between calls (`set_planned_steps`)."""


def fitted_schedule(config: OptimConfig, total_steps: int, values: dict[str, Any]) -> optax.Schedule:
    """`config`'s warmup-cosine laid out over `total_steps`, stretched or squeezed to
    `values["planned_steps"]` (an array, possibly traced: the program does not depend on it): the
    warmup and the decay keep their shares of the run, and the rate reaches `min_lr` on the last
    planned step (count planned - 1). Written in jnp so the length can change between calls
    without compiling again; runs without a deadline keep optax's schedule and its bits."""
    nominal = max(total_steps, 1)
    decay = max(config.decay_steps or nominal, config.warmup_steps + 1)
    lr, min_lr, planned = values["lr"], values["min_lr"], values[PLANNED]
    scale = jnp.maximum(planned - 1.0, 1.0) / nominal
    warmup, end = config.warmup_steps * scale, decay * scale

    def schedule(count: jax.Array) -> jax.Array:
        c = jnp.asarray(count, jnp.float32)
        rising = lr * c / jnp.maximum(warmup, 1e-9)  # (only where c < warmup, so never with warmup 0)
        t = jnp.clip((c - warmup) / (end - warmup), 0.0, 1.0)
        falling = min_lr + (lr - min_lr) * 0.5 * (1.0 + jnp.cos(jnp.pi * t))
        return jnp.where(c < warmup, rising, falling)

    return schedule


def set_planned_steps(opt_state: optax.OptState, steps: int) -> optax.OptState:
    """`opt_state` with the schedule length of each fitted `with_values` state set to `steps`
    (placed where the old value was, so the compiled calls take it as they took that)."""
    is_values = lambda x: isinstance(x, ValuesState)  # noqa: E731

    def put(x: Any) -> Any:
        if not is_values(x) or PLANNED not in x.values:
            return x
        old = x.values[PLANNED]
        new = jax.device_put(jnp.asarray(steps, jnp.float32), old.sharding)
        return x._replace(values={**x.values, PLANNED: new})

    return jax.tree.map(put, opt_state, is_leaf=is_values)


def planned_steps_of(opt_state: optax.OptState) -> jax.Array | None:
    """The schedule length a fitted `with_values` state holds in `opt_state`, or None (no deadline
    fits this optimizer's schedule: the user's optimizer, or a schedule without a length)."""
    is_values = lambda x: isinstance(x, ValuesState)  # noqa: E731
    for leaf in jax.tree.leaves(opt_state, is_leaf=is_values):
        if is_values(leaf) and PLANNED in leaf.values:
            return leaf.values[PLANNED]
    return None


def decay_mask(params: optax.Params) -> optax.Params:
    """Weight decay applies to matrices and embeddings (ndim >= 2), not to biases or norm scales,
    as in nanoGPT and most transformer recipes."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def build_optimizer(config: OptimConfig, total_steps: int, schedule: optax.Schedule | None = None,
                    values: dict[str, Any] | None = None) -> optax.GradientTransformation:
    """An optax chain: [clip by global norm] → [L2 decay] → update rule with the schedule.

    Weight decay (L2 for sgd/adam, decoupled for adamw) skips parameters with ndim < 2 (`decay_mask`).

    Args:
      config: optimizer settings.
      total_steps: optimizer steps in the whole run (the default cosine decay length).
      schedule: `build_schedule(config, total_steps)` when the caller has it already.
      values: the numbers of `VALUES` (arrays, possibly traced: see `with_values`) in place of the
        config's; the config still decides which parts the chain has.
    """
    v = {name: getattr(config, name) for name in VALUES} | (values or {})
    lr = schedule if schedule is not None else build_schedule(config, total_steps, values)
    parts: list[optax.GradientTransformation] = []
    if config.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(v["clip_norm"]))
    if config.weight_decay > 0 and config.name != "adamw":
        parts.append(optax.add_decayed_weights(v["weight_decay"], mask=decay_mask))
    if config.name == "sgd":
        parts.append(optax.sgd(lr, momentum=v["momentum"] if config.momentum else None))
    elif config.name == "adam":
        parts.append(optax.adam(lr, b1=v["b1"], b2=v["b2"], eps=v["eps"]))
    else:
        parts.append(
            optax.adamw(lr, b1=v["b1"], b2=v["b2"], eps=v["eps"], weight_decay=v["weight_decay"], mask=decay_mask)
        )
    return parts[0] if len(parts) == 1 else optax.chain(*parts)


def optimizer_structure(config: OptimConfig) -> dict[str, Any]:
    """What `build_optimizer(config, values=...)` takes from `config` rather than from `values`: the
    chain's parts and the schedule's shape. Configs with equal structures share one `with_values`
    update function."""
    fixed = {k: v for k, v in dataclasses.asdict(config).items() if k not in VALUES}
    return {**fixed, "clips": config.clip_norm > 0, "decays": config.weight_decay > 0,
            "momentum": config.momentum > 0}


class ValuesState(NamedTuple):
    """`with_values`' state: the optimizer's numbers, the rate of the last update and the inner state."""

    count: jax.Array  # type: ignore[assignment]  # the update count, named as optax's states name it
    values: dict[str, jax.Array]
    learning_rate: jax.Array
    inner: optax.OptState


def with_values(config: OptimConfig, total_steps: int, names: tuple[str, ...] = VALUES,
                fitted: bool = False) -> optax.GradientTransformation:
    """`build_optimizer(config)` with its numbers `names` (default `VALUES`: learning rate, betas,
    weight decay, ...; `lr` and `min_lr` always among them) held in the optimizer state rather than
    in the program, as `optax.inject_hyperparams` does, so that runs which differ only in them share
    one update function: a population's members, stacked and vmapped (every number), and runs
    one after another, whose programs the compilation cache then shares (`EXACT_VALUES`). The
    config decides the chain's parts, the schedule's shape and the numbers not in `names`;
    `learning_rate` in the state is the rate of the last update, as `learning_rate_fn` reads it.
    `fitted` (a run with a deadline) also holds the schedule's length (`PLANNED`, starting at
    `total_steps`), which `set_planned_steps` changes between calls (`fitted_schedule`).

    Raises:
      ValueError: the exponential schedule (optax checks its rates in Python).
    """
    if config.schedule == "exponential":
        raise ValueError("with_values does not take the exponential schedule")

    def init(params: optax.Params) -> ValuesState:
        values = {name: jnp.asarray(getattr(config, name), jnp.float32) for name in names}
        if fitted:
            values[PLANNED] = jnp.asarray(total_steps, jnp.float32)
        return ValuesState(jnp.zeros([], jnp.int32), values, jnp.asarray(config.lr, jnp.float32),
                           build_optimizer(config, total_steps, values=values).init(params))

    def update(updates: optax.Updates, state: ValuesState, params: optax.Params | None = None, **extra_args: Any):
        tx = build_optimizer(config, total_steps, values=state.values)  # built from the config: no extra args
        updates, inner = tx.update(updates, state.inner, params)
        lr = jnp.asarray(build_schedule(config, total_steps, state.values)(state.count), jnp.float32)
        return updates, ValuesState(optax.safe_int32_increment(state.count), state.values, lr, inner)

    return optax.GradientTransformationExtraArgs(init, update)


def without_values(opt_state: optax.OptState) -> optax.OptState:
    """`opt_state` with each `with_values` state replaced by its inner state: the state
    `build_optimizer(config)` keeps, so that a run trained with its numbers in the state is saved
    as the run with them in the program would be."""
    is_values = lambda x: isinstance(x, ValuesState)  # noqa: E731
    return jax.tree.map(lambda x: x.inner if is_values(x) else x, opt_state, is_leaf=is_values)


def restore_values(template: optax.OptState, saved: optax.OptState) -> optax.OptState:
    """`saved` (an optimizer state without its numbers: `without_values`, as checkpoints hold it)
    with each `with_values` state of `template` put back around it: the numbers `template` holds
    (the run's config), the update count read from the inner schedule's."""
    is_values = lambda x: isinstance(x, ValuesState)  # noqa: E731

    def put_back(t: Any, s: Any) -> Any:
        if not is_values(t):
            return s
        is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
        counts = [x.count for x in jax.tree.leaves(s, is_leaf=is_schedule) if is_schedule(x)]
        return t._replace(count=jnp.copy(counts[0]) if counts else t.count, inner=s)  # a buffer of its own

    return jax.tree.map(put_back, template, saved, is_leaf=is_values)  # `saved` has template's leaves as prefix


def build_train_optimizer(
    config: TrainConfig, total_steps: int, optimizer: optax.GradientTransformation | None = None,
    schedule: optax.Schedule | None = None,
) -> optax.GradientTransformation:
    """The optimizer of a training run: `optimizer` when given, else `config.optim`'s with its
    numbers held in its state (`with_values`: runs that differ only in them compile one program,
    and share it through the compilation cache; not the exponential schedule, whose rates optax
    checks in Python); with `config.ema` keeping an average of the weights (`with_ema`); with
    `on_nan="skip"` wrapped in `optax.apply_if_finite`, so a non-finite gradient leaves the state
    unchanged (and is counted); with fp16 precision wrapped in dynamic loss scaling. Checkpoints
    hold the state `without_values`, as the optimizer with its numbers in the program keeps it."""
    if optimizer is not None:
        tx = optimizer
    elif config.optim.schedule == "exponential":
        tx = build_optimizer(config.optim, total_steps, schedule)
    else:
        fitted = config.max_time_s > 0 and config.optim.schedule == "warmup-cosine"  # a deadline's schedule
        tx = with_values(config.optim, total_steps, EXACT_VALUES, fitted=fitted)
    if config.ema:  # inside the skipping wrappers: a skipped update leaves the average as it was
        tx = with_ema(tx, config.ema)
    if config.on_nan == "skip":
        tx = optax.apply_if_finite(tx, max_consecutive_errors=2**31 - 1)
    return policy_of(config).wrap(tx)


class EmaState(NamedTuple):
    """`with_ema`'s state: the average of the weights, and the wrapped optimizer's state."""

    average: optax.Params
    inner: optax.OptState


def with_ema(tx: optax.GradientTransformation, decay: float) -> optax.GradientTransformation:
    """`tx` that also keeps an exponential moving average of the parameters it updates:
    `ema <- decay * ema + (1 - decay) * (params + updates)` after each update, starting from the
    initial parameters (no bias correction, as Keras' `use_ema` and timm's ModelEmaV2). The average
    lives in the optimizer state, so checkpoints save and resume it; `ema_params` reads it."""

    inner_tx = optax.with_extra_args_support(tx)

    def init(params: optax.Params) -> EmaState:
        return EmaState(jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params), inner_tx.init(params))

    def update(updates: optax.Updates, state: EmaState, params: optax.Params | None = None, **extra_args: Any):
        if params is None:
            raise ValueError("with_ema needs the parameters in update()")
        updates, inner = inner_tx.update(updates, state.inner, params, **extra_args)
        new = optax.apply_updates(params, updates)
        average = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p.astype(jnp.float32), state.average, new)
        return updates, EmaState(average, inner)

    return optax.GradientTransformationExtraArgs(init, update)


def ema_params(opt_state: optax.OptState) -> optax.Params | None:
    """The average of the weights `with_ema` keeps inside `opt_state`, or None."""
    is_ema = lambda x: isinstance(x, EmaState)  # noqa: E731
    for leaf in jax.tree.leaves(opt_state, is_leaf=is_ema):
        if is_ema(leaf):
            return leaf.average
    return None


class LoggedRateState(NamedTuple):
    """`log_learning_rate`'s state: the update count, the rate of the last update and the inner state."""

    count: jax.Array  # type: ignore[assignment]  # the update count, named as optax's states name it
    learning_rate: jax.Array
    inner: optax.OptState


def log_learning_rate(optimizer: optax.GradientTransformation,
                      schedule: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    """`optimizer` (your own optax transformation, built with `schedule`) with the learning rate of
    each update kept in its state, so that `fit` logs it as `lr` (in metrics.jsonl, the progress
    lines, TensorBoard and the trackers). `fit` reads the rate from the state of optax's
    `inject_hyperparams` by itself; an optimizer built otherwise (`optax.adamw(schedule)`, a chain,
    your own transformation) keeps its schedule where nothing can read it, hence this wrapper.

    The rate logged for an update is `schedule(n)`, n the updates applied before it: the count
    optax's own schedules are evaluated at, also after a resume and where `on_nan="skip"` skipped
    updates (a skipped update counts in neither). Updates are `optimizer`'s, unchanged.

    Args:
      optimizer: the optax transformation to train with.
      schedule: the schedule it was built with (`step -> rate`), or its constant rate.

    Example:
      schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 10_000)
      fit(model, loss_fn, data, optimizer=jaxtrain.log_learning_rate(optax.adamw(schedule), schedule))
    """
    rate = schedule if callable(schedule) else (lambda count: schedule)
    inner_tx = optax.with_extra_args_support(optimizer)

    def init(params: optax.Params) -> LoggedRateState:
        return LoggedRateState(jnp.zeros([], jnp.int32), jnp.asarray(rate(0), jnp.float32), inner_tx.init(params))

    def update(updates: optax.Updates, state: LoggedRateState, params: optax.Params | None = None, **extra_args: Any):
        updates, inner = inner_tx.update(updates, state.inner, params, **extra_args)
        lr = jnp.asarray(rate(state.count), jnp.float32)
        return updates, LoggedRateState(optax.safe_int32_increment(state.count), lr, inner)

    return optax.GradientTransformationExtraArgs(init, update)


def _injected_learning_rate(opt_state: optax.OptState) -> jax.Array | None:
    """The `learning_rate` hyperparameter of the first `optax.inject_hyperparams` state inside
    `opt_state` (or the rate `with_values` or `log_learning_rate` keeps), or None."""
    kinds = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState, ValuesState, LoggedRateState)
    is_injected = lambda x: isinstance(x, kinds)  # noqa: E731
    for leaf in jax.tree.leaves(opt_state, is_leaf=is_injected):
        if isinstance(leaf, (ValuesState, LoggedRateState)):
            return leaf.learning_rate
        if is_injected(leaf) and "learning_rate" in leaf.hyperparams:
            return leaf.hyperparams["learning_rate"]
    return None


def _times_plateau_scales(lr: jax.Array, opt_state: optax.OptState) -> jax.Array:
    """`lr` times the scale of each `optax.contrib.reduce_on_plateau` state in `opt_state` (as it is
    without): that transform scales the updates, so the rate they are made with is the product."""
    is_plateau = lambda x: isinstance(x, optax.contrib.ReduceLROnPlateauState)  # noqa: E731
    for leaf in jax.tree.leaves(opt_state, is_leaf=is_plateau):
        if is_plateau(leaf):
            lr = lr * leaf.scale
    return lr


def learning_rate_fn(
    tx: optax.GradientTransformation, params: optax.Params, schedule: optax.Schedule | None = None
) -> Callable[[optax.OptState, jax.Array], jax.Array] | None:
    """`lr(updated_opt_state, step)`, the learning rate an update used, for logging; None when
    neither applies.

    It is read from the optimizer state where the optimizer holds it (`optax.inject_hyperparams`
    anywhere in a chain or wrapper, `with_values`, `log_learning_rate`), times the scale of each
    `optax.contrib.reduce_on_plateau` in it; else computed from `schedule` (the config's) at the
    step's index. Not recognised: a schedule given straight to an optax optimizer
    (`optax.adamw(schedule)`), whose state keeps only a count, not the schedule.
    """
    if _injected_learning_rate(jax.eval_shape(tx.init, params)) is not None:

        def injected(opt_state: optax.OptState, step: jax.Array) -> jax.Array:
            lr = _injected_learning_rate(opt_state)
            assert lr is not None  # opt_state has tx.init's structure, which holds it
            return _times_plateau_scales(lr, opt_state)

        return injected
    if schedule is not None:
        return lambda opt_state, step: jnp.asarray(schedule(step), jnp.float32)
    return None


def toggle_skip(opt_state: Any, counters: Callable[[], tuple[Any, Any, Any]]) -> Any:
    """`opt_state` (or a pytree shaped like it, such as its shardings) as `on_nan` the other way
    would have made it: `optax.apply_if_finite`'s wrapper removed where `build_train_optimizer`
    put it (inside fp16 loss scaling's state), else added there with `counters()`
    (notfinite_count, last_finite, total_notfinite). The inner optimizer's state is kept, so a
    checkpoint of either `on_nan` resumes under the other."""
    if isinstance(opt_state, LossScaleState):
        return opt_state._replace(inner=toggle_skip(opt_state.inner, counters))
    if isinstance(opt_state, optax.ApplyIfFiniteState):
        return opt_state.inner_state
    return optax.ApplyIfFiniteState(*counters(), inner_state=opt_state)


def fresh_skip_counters() -> tuple[jax.Array, jax.Array, jax.Array]:
    """`optax.apply_if_finite`'s counters as it initialises them: no update skipped yet."""
    state = optax.apply_if_finite(optax.identity(), 1).init({})
    return state.notfinite_count, state.last_finite, state.total_notfinite
