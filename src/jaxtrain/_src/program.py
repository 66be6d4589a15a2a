"""The program builder: everything a run compiles, built once, in one place.

`build_program` makes the layout (mesh and shardings), the feed, the optimizer and its schedule,
the initial train state placed on the mesh, the precision policy and the pure train step; the
`Program` it returns compiles the K-step calls, one training step, or the evaluation step, and
restores a checkpoint into its state. `fit`, the batch-size finder, self-play and every benchmark
get their program here; nothing else calls `make_train_step`, `init_state` or `build_optimizer`
to assemble one by hand (tests/library/test_layers.py walks the source to keep it so).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import optax
from flax import nnx

from jaxtrain._src import form_memory
from jaxtrain._src.calls import CompiledCalls
from jaxtrain._src.checks import abstract_batch
from jaxtrain._src.choosers import AutoSteps, StepForm, StepsPerCall
from jaxtrain._src.compiling import CallSource
from jaxtrain._src.config import TrainConfig
from jaxtrain._src.feeds import Feed, make_feed
from jaxtrain._src.form_memory import FormMemory
from jaxtrain._src.keys import seed_keys
from jaxtrain._src.loop_state import LoopState
from jaxtrain._src.memory import release_free_heap
from jaxtrain._src.moments import announce
from jaxtrain._src.optim import build_schedule, build_train_optimizer, learning_rate_fn
from jaxtrain._src.precision import Policy, note_float32_products, policy_of
from jaxtrain._src.rewrite import LossRewrite, rewrite_loss
from jaxtrain._src.sharding import Layout, make_layout
from jaxtrain._src.state import TrainState, eval_graphdef, in_mode, init_state, split_params
from jaxtrain._src.step import Augment, LossFn, Preprocess, loss_input, make_eval_step, make_train_step

__all__ = ["Program", "build_program"]


@dataclasses.dataclass
class Program:
    """A run's training program.

    Attributes:
      config: the training settings it was built for.
      layout: the mesh of devices and the shardings of the state and batches.
      feed: where batches come from (None when built without training data).
      tx: the optimizer (the user's or `config.optim`'s, wrapped for `on_nan` and the precision).
      schedule: the config's learning-rate schedule (None with the user's optimizer).
      policy: the precision policy.
      graphdef: the model's static graph definition.
      state: the train state, placed as `state_shardings` say (abstract shapes when built abstract).
      state_shardings: where each array of the state lives on the mesh.
      train_step: the pure `train_step(state, batch) -> (state, metrics)`.
      eval_step: the pure evaluation step, in the model's evaluation mode and the training dtype.
      total_steps: the optimizer steps the schedule is laid out over.
      rewrites: what of the loss was rewritten for XLA:CPU (`rewrite.rewrite_loss`), or None.
      loss_clean: the loss, as trained, is known to hold no op that XLA:CPU runs slowly in a loop.
      logs_lr: the step's metrics hold `lr`, the learning rate of each update (`optim.learning_rate_fn`).
      rewrite_declined: why the rewrite that `config.rewrite` asked for did not happen, or None.
    """

    config: TrainConfig
    layout: Layout
    feed: Feed | None
    tx: optax.GradientTransformation
    schedule: optax.Schedule | None
    policy: Policy
    graphdef: nnx.GraphDef
    state: TrainState
    state_shardings: Any
    train_step: Callable
    eval_step: Callable
    total_steps: int
    rewrites: str | None = None
    loss_clean: bool = False
    logs_lr: bool = False
    rewrite_declined: str | None = None

    def calls(self, steps_per_call: int = 0, auto: AutoSteps = AutoSteps(), source: CallSource | None = None,
              log: Callable[[str], None] = lambda message: None, form: str | None = None) -> CompiledCalls:
        """The compiled K-step calls over `source` (the program's feed by default): K fixed at
        `steps_per_call`, or chosen by timing the first calls when 0; their form (`StepForm`) as
        `form` says (default `config.step_form`: "auto" times the forms on the first steps)."""
        source = source if source is not None else self.feed
        if source is None:
            raise ValueError("Program.calls needs a source: the program was built without training data")
        per_epoch = getattr(source, "steps_per_epoch", None) or max(steps_per_call, 1)
        chooser = StepsPerCall(steps_per_call, per_epoch, auto, self.total_steps - _step_of(self.state))
        step_form = StepForm(form or self.config.step_form, auto)
        if step_form.fixed and self.config.step_form == "auto":  # a resume computes as its run did
            step_form.why, step_form.decided = "the form the run began with", "resumed"
        if step_form.dispatched:  # a dispatched call's cost is its steps': no K to measure
            chooser.stop()
        return CompiledCalls(source, self.train_step, self.state, chooser, self.layout, log=log,
                             state_shardings=self.state_shardings, form=step_form, rewrites=self.rewrites,
                             loss_clean=self.loss_clean, memory=_form_memory(step_form))

    def compile_step(self, batch: Any, options: dict[str, Any] | None = None) -> Any:
        """One training step compiled ahead of time for `batch` (arrays or abstract shapes, split
        over the mesh's data axis), with the state donated."""
        layout = self.layout
        batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=layout.batch), batch)
        jitted = jax.jit(self.train_step, donate_argnums=0,
                         in_shardings=(self.state_shardings, jax.tree.map(lambda _: layout.batch, batch)),
                         out_shardings=(self.state_shardings, layout.replicated))
        state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.state,
                             self.state_shardings)
        return jitted.lower(state, batch).compile(options)

    def restore(self, checkpoints: Any, epochs: int | None = None) -> LoopState:
        """Continues from the newest complete checkpoint of `checkpoints` (a `CheckpointHook`):
        the state (placed on this program's mesh, whatever mesh wrote it), the feed's position and
        arrays; returns the loop state. The training data must be those the checkpoint was trained
        on, unless `config.data.accept_changed`."""
        self.state, loop = checkpoints.restore(self.state, self.state_shardings, epochs, self.feed,
                                               self.config.data.accept_changed)
        return loop


def _form_memory(form: StepForm) -> FormMemory | None:
    """Where an "auto" form's decision is kept between runs: the compile cache's folder, if any."""
    directory = form_memory.memory_dir() if form.measuring else None
    return FormMemory(directory) if directory is not None else None


def _step_of(state: TrainState) -> int:
    return 0 if isinstance(state.step, jax.ShapeDtypeStruct) else int(state.step)


def build_program(
    model: nnx.Module,
    loss_fn: LossFn,
    config: TrainConfig,
    *,
    train_data: Any = None,
    optimizer: optax.GradientTransformation | None = None,
    preprocess: Preprocess | None = None,
    augment: Augment | None = None,
    total_steps: int | None = None,
    layout: Layout | None = None,
    abstract: bool = False,
) -> Program:
    """Builds a run's training program.

    Args:
      model: the Flax NNX model (abstract, from `nnx.eval_shape`, when `abstract`).
      loss_fn: `loss_fn(model, batch, key) -> (loss, metrics)`.
      config: the training settings.
      train_data: the training data (arrays, a row source, or data that make their own feed);
        None builds no feed (then pass `total_steps`).
      optimizer: the user's optax transformation; None builds `config.optim`'s.
      preprocess, augment: traced into the step, as `fit` takes them.
      total_steps: the steps the schedule spans; default `config.epochs` epochs of the feed.
      layout: the mesh; default `config.mesh` over every device.
      abstract: build the state as shapes only (nothing allocated; for compile-only measurements).

    The seed splits into the step key (dropout and other per-step randomness) and the data key
    (the epoch permutations), so neither depends on the other's use (`keys.seed_keys`).
    """
    release_free_heap()  # what building the model and data freed (an eager init compiles every op)
    layout = layout if layout is not None else make_layout(config.mesh)
    step_key, data_key = seed_keys(config.seed)
    feed = make_feed(train_data, config, data_key, layout) if train_data is not None else None
    if feed is not None:
        announce("feed made")
    if total_steps is None:
        if feed is None:
            raise ValueError("build_program needs train_data or total_steps")
        total_steps = config.epochs * feed.steps_per_epoch
    schedule = build_schedule(config.optim, total_steps) if optimizer is None else None
    tx = build_train_optimizer(config, total_steps, optimizer, schedule)
    if abstract:
        graphdef, params, rest = split_params(in_mode(model, train=True))  # as init_state splits
        state = jax.eval_shape(lambda p, r: init_state(nnx.merge(graphdef, p, r), tx, step_key)[1], params, rest)
    else:
        graphdef, state = init_state(model, tx, step_key)
    shardings = layout.state_shardings(state)
    if not abstract:
        state = layout.put(state, shardings)
        announce("state initialised")
    policy = policy_of(config)
    rewrite = LossRewrite(loss_fn)
    if train_data is not None:  # XLA:CPU's slow ops, rewritten before differentiation
        training = in_mode(model, train=True)
        batch = _one_batch(train_data, config)
        seen = functools.partial(loss_input, preprocess=preprocess, augment=augment)
        rewrite = rewrite_loss(loss_fn, training, batch, config.rewrite, transform=seen)
        loss_fn = rewrite.loss
        if batch is not None and policy.name != "fp32" and not abstract:  # products kept in float32 under bf16/fp16
            try:
                loss_batch = jax.eval_shape(seen, batch, jax.random.key(0))
            except Exception:  # noqa: BLE001 - preprocess or augment fails with its own error in the step
                loss_batch = None
            if loss_batch is not None:
                note_float32_products(loss_fn, training, loss_batch, policy)
    lr = learning_rate_fn(tx, state.params, schedule)
    train_step = make_train_step(graphdef, loss_fn, tx, preprocess, augment, lr, layout.gather_params,
                                 layout.split_grads, policy, config.grad_accum)
    eval_step = make_eval_step(eval_graphdef(model), loss_fn, preprocess, policy)
    return Program(config, layout, feed, tx, schedule, policy, graphdef, state, shardings, train_step, eval_step,
                   total_steps, rewrite.rewrites, rewrite.clean, lr is not None, rewrite.declined)


def _one_batch(train_data: Any, config: TrainConfig) -> Any:
    """One training batch as abstract shapes, as the data hold it (before preprocess and augment);
    None for data that only their feed describes (a loader's batches)."""
    try:
        return abstract_batch(train_data, config.batch_size, "train_data")
    except Exception:  # noqa: BLE001 - data described only by their feed: no rewrite
        return None

