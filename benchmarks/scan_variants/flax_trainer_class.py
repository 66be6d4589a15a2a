"""A trainer class around a Flax TrainState (the shape of UvA DL course notebooks' TrainerModule):
`train_epoch` iterates a NumPy-collated loader, a method converts each batch, the jitted step is an
attribute, and the metrics are read with `jax.device_get` every step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state


class TrainerModule:
    def __init__(self, model, example, lr=1e-3):
        params = model.init(jax.random.PRNGKey(0), example)["params"]
        self.state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(lr))

        def train_step(state, batch):
            def loss_fn(params):
                logits = state.apply_fn({"params": params}, batch[0])
                return optax.softmax_cross_entropy_with_integer_labels(logits, batch[1]).mean()

            loss, grads = jax.value_and_grad(loss_fn)(state.params)
            return state.apply_gradients(grads=grads), loss

        self.train_step = jax.jit(train_step)

    def to_device(self, batch):
        imgs, labels = batch
        imgs = (np.asarray(imgs, np.float32) - 0.5) / 0.25  # scan: numpy-in-loop
        return jnp.array(imgs), jnp.array(labels)  # scan: per-batch-transfer

    def train_epoch(self, loader):
        metrics = []
        for batch in loader:
            batch = self.to_device(batch)
            self.state, loss = self.train_step(self.state, batch)
            metrics.append(jax.device_get(loss))  # scan: host-sync
        return np.mean(metrics)  # scan: clean

    def train_model(self, loader, num_epochs):
        for epoch in range(num_epochs):
            avg = self.train_epoch(loader)
            print(f"epoch {epoch}: {avg:.4f}")  # scan: clean
