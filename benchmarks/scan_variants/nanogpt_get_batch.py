"""A nanoGPT-style loop in JAX: `get_batch` draws random offsets with NumPy and stacks the windows
on the host, puts them on the device, and the `while True` loop reads the loss every iteration
(the shape of karpathy/nanoGPT's train.py ported to JAX, with the log read moved out of its
`if iter_num % log_interval == 0`)."""

import jax
import numpy as np
import optax

block_size, batch_size, max_iters, eval_interval = 64, 12, 5000, 250
train_data = np.memmap("train.bin", dtype=np.uint16, mode="r")


def get_batch():
    ix = np.random.randint(len(train_data) - block_size, size=(batch_size,))  # scan: numpy-in-loop
    x = np.stack([train_data[i:i + block_size].astype(np.int64) for i in ix])  # scan: numpy-in-loop
    y = np.stack([train_data[i + 1:i + 1 + block_size].astype(np.int64) for i in ix])  # scan: numpy-in-loop
    return jax.device_put(x), jax.device_put(y)  # scan: per-batch-transfer


def compile_train_step(model_apply, tx):
    @jax.jit
    def train_step(params, opt_state, x, y, key):
        def loss_fn(p):
            logits = model_apply(p, x, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def main(model_apply, params):
    tx = optax.adamw(6e-4)
    opt_state = tx.init(params)
    train_step = compile_train_step(model_apply, tx)
    key = jax.random.PRNGKey(1337)
    iter_num, losses = 0, []
    while True:
        key, sub = jax.random.split(key)
        x, y = get_batch()
        params, opt_state, loss = train_step(params, opt_state, x, y, sub)
        lossf = np.asarray(loss)  # scan: host-sync
        losses.append(lossf)
        if iter_num % eval_interval == 0:
            print(f"iter {iter_num}: loss {lossf:.4f}")  # scan: clean
        iter_num += 1
        if iter_num > max_iters:
            break
    return params
