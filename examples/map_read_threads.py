"""Reading a map-style dataset one sample at a time: 1 thread against 4, while training streams it.

A PyTorch `Dataset` that indexes its tensors in Python (no slices taken: one sample per call) is
streamed by `jaxtrain.fit` (mlp-regression's MLP, batch 32, 50,000 rows, 2 epochs of 1,000 steps)
with `MapSource(threads=1)`, `threads=4` and the automatic choice, each twice, interleaved, in
this process. Prints samples/s. Needs torch (`pip install torch==2.13.0`).

    python examples/map_read_threads.py
"""

import jax.numpy as jnp
import torch
from flax import nnx

from jaxtrain import CheckpointConfig, DataConfig, TrainConfig, fit
from jaxtrain.data import MapSource, make_rows
from jaxtrain.models import MLP

rows = make_rows("mlp-regression", 0, 0, 50_000)
x, y = torch.from_numpy(rows["features"]), torch.from_numpy(rows["targets"])


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return len(x)

    def __getitem__(self, i):
        i = int(i)  # one sample per call
        return {"x": x[i], "y": y[i]}


def loss(model, batch, key):
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}


config = TrainConfig(epochs=2, batch_size=32, steps_per_epoch=1000, tensorboard=False, log_every=10**6,
                     checkpoint=CheckpointConfig(enabled=False), data=DataConfig(placement="stream"))
for repeat in range(2):
    for threads in (1, 4, None):
        result = fit(MLP((128, 512, 512, 64), rngs=nnx.Rngs(0)), loss, MapSource(Samples(), threads=threads), None,
                     config, verbosity="silent")
        print(f"run {repeat + 1}, threads={threads or 'auto'}: {result.summary['samples_per_s']:,.0f} samples/s")
