"""An optimizer built from the config holds its numbers (learning rate, weight decay, betas,
clipping) in its state, not in the program: runs that differ only in them compile one program
(the others load it from the persistent cache), train as the numbers-in-the-program optimizer
does (bit for bit: the betas stay in the program, see `optim.EXACT_VALUES`), and checkpoint as
it did."""

import dataclasses

import jax
import pytest
from conftest import leaves_close, mse, regression_data, small_mlp

from jaxtrain import CheckpointConfig, OptimConfig, TrainConfig, fit
from jaxtrain._src.optim import build_optimizer

# The bits of XLA's own code generation: under the suite's flags the two differ in the 7th digit.
pytestmark = pytest.mark.xla_defaults

DATA = regression_data(192)


def config(lr: float, weight_decay: float, b1: float = 0.9, clip_norm: float = 1.0) -> TrainConfig:
    optim = OptimConfig(name="adamw", lr=lr, weight_decay=weight_decay, b1=b1, schedule="warmup-cosine",
                        warmup_steps=3, min_lr=lr / 10, clip_norm=clip_norm)
    return TrainConfig(epochs=2, batch_size=32, optim=optim, steps_per_call=6, step_form="scan", tensorboard=False,
                       checkpoint=CheckpointConfig(enabled=False))


@pytest.mark.skipif(not jax.config.jax_compilation_cache_dir, reason="the persistent compilation cache is off")
def test_runs_that_differ_only_in_numbers_compile_their_training_program_once():
    configs = [config(1e-3, 1e-4), config(3e-3, 1e-2, clip_norm=0.5), config(2e-4, 3e-3)]
    results = [fit(small_mlp(0), mse, DATA, None, c, verbosity="silent") for c in configs]
    cached = [[c["cached"] for c in r.summary["profile"]["compiles"] if c["what"] == "train call"] for r in results]
    assert cached[1:] == [[True], [True]], cached  # the first compiled it (or an earlier test did): the rest load it
    losses = [r.final_train_loss for r in results]
    assert len(set(losses)) == 3  # each trained with its own numbers
    # a change of shape, or of a beta (a number of the program), is another program
    for other in (dataclasses.replace(configs[0], batch_size=48), config(1e-3, 1e-4, b1=0.81)):
        other = fit(small_mlp(0), mse, DATA, None, other, verbosity="silent")
        assert [c["cached"] for c in other.summary["profile"]["compiles"] if c["what"] == "train call"] == [False]


def test_numbers_in_the_state_train_as_numbers_in_the_program():
    c = config(3e-3, 1e-2, b1=0.8)
    held = fit(small_mlp(0), mse, DATA, None, c, verbosity="silent")
    steps = c.epochs * len(DATA["x"]) // c.batch_size
    in_program = fit(small_mlp(0), mse, DATA, None, c, optimizer=build_optimizer(c.optim, steps), verbosity="silent")
    assert leaves_close(held.state.params, in_program.state.params) == 0.0  # bit for bit
    assert "lr" in held.state.opt_state.values and "b2" not in held.state.opt_state.values
