"""The case study's workload with `jaxtrain.fit`: examples/case_study_loop.py, fixed.

The same data, model, loss, SGD and preprocessing as the original loop; `fit` puts the data on the
device once, traces normalisation and noise into one compiled step with the optax update, fuses K
steps per call with `lax.scan`, donates the state and reads the loss back once per call.
`jaxtrain scan examples/case_study_fixed.py` finds nothing.

    python examples/case_study_fixed.py --epochs 1
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp
from case_study_loop import EPS, LR, SIZES, make_data  # the original's data and settings
from flax import nnx

from jaxtrain import OptimConfig, TrainConfig, data, fit
from jaxtrain._src.models import MLP


def mse(model: nnx.Module, batch: dict, key) -> tuple:
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    x, y = make_data(args.samples, args.seed + 1)
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, seed=args.seed,
                         optim=OptimConfig(name="sgd", lr=LR))
    result = fit(MLP(SIZES, rngs=nnx.Rngs(args.seed)), mse, {"x": x, "y": y}, None, config,
                 preprocess=data.normalize("x", x.mean(0), x.std(0), EPS), augment=data.gaussian_noise("x", args.noise),
                 verbosity="summary")
    print(f"final train loss {result.final_train_loss:.4f}")


if __name__ == "__main__":
    main()
