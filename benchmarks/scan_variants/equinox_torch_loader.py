"""Equinox CNN fed by a PyTorch DataLoader (the shape of Equinox's MNIST CNN example): the batches
converted with `.numpy()` in the loop, a `filter_jit` step, the loss appended as a Python float every
step and printed every `print_every` steps."""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


def loss(model, x, y):
    pred_y = jax.vmap(model)(x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(pred_y), y[:, None], axis=1))


def train(model, trainloader, optim, steps, print_every):
    opt_state = optim.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def make_step(model, opt_state, x, y):
        loss_value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        return model, opt_state, loss_value

    def infinite_trainloader():
        while True:
            yield from trainloader

    history = []
    for step, (x, y) in zip(range(steps), infinite_trainloader()):
        x = jnp.asarray(x.numpy())  # scan: per-batch-transfer
        y = jnp.asarray(y.numpy())  # scan: per-batch-transfer
        model, opt_state, train_loss = make_step(model, opt_state, x, y)
        history.append(train_loss.item())  # scan: host-sync
        if (step % print_every) == 0 or (step == steps - 1):
            print(f"step={step}, train_loss={train_loss.item()}")  # scan: clean
    return model, history


def main(trainloader):
    model = eqx.nn.MLP(784, 10, 64, 2, key=jax.random.PRNGKey(0))
    return train(model, trainloader, optax.adamw(3e-4), steps=300, print_every=30)
