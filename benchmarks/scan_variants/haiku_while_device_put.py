"""Haiku and optax with a `while` loop over a batch iterator (the shape of dm-haiku's examples):
each batch put on the device by hand, and every step waited for to time it."""

import time

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax


def net_fn(images):
    mlp = hk.Sequential([hk.Flatten(), hk.Linear(300), jax.nn.relu, hk.Linear(10)])
    return mlp(images)


net = hk.without_apply_rng(hk.transform(net_fn))
opt = optax.adam(1e-3)


def loss(params, batch):
    logits = net.apply(params, batch["image"])
    labels = jax.nn.one_hot(batch["label"], 10)
    return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))


@jax.jit
def update(params, opt_state, batch):
    value, grads = jax.value_and_grad(loss)(params, batch)
    updates, opt_state = opt.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, value


def main(dataset, num_steps):
    batch = next(dataset)
    params = net.init(jax.random.PRNGKey(42), batch["image"])
    opt_state = opt.init(params)
    step, times = 0, []
    while step < num_steps:
        batch = next(dataset)
        batch = {"image": np.asarray(batch["image"], np.float32) / 255.0,  # scan: numpy-in-loop
                 "label": batch["label"]}
        batch = jax.device_put(batch)  # scan: per-batch-transfer
        t0 = time.perf_counter()
        params, opt_state, value = update(params, opt_state, batch)
        value.block_until_ready()  # scan: host-sync
        times.append(time.perf_counter() - t0)
        step += 1
        if step % 1000 == 0:
            print({"step": step, "loss": float(value)})  # scan: clean
    return params
