"""`vae`: the variational autoencoder of Flax's VAE example, in NNX.

Source: google/flax `examples/vae/models.py` (Encoder 784 → 500 → (mean, logvar) of 20 latents,
Decoder 20 → 500 → 784 logits, `reparameterize`) and `examples/vae/train.py` (binary cross-entropy
with logits + KL divergence, both summed per image and averaged over the batch; Adam 1e-3; batch
128; binarized MNIST flattened to 784). The noise of the reparameterisation comes from a key the
step passes to `model(x, z_rng)`, as the example's `train_step` does with its per-step `z_rng`;
here that key is the loss's. The example's `train_step` has run un-jitted since a 2023 refactor
dropped its `@jax.jit`; its hand loop here is the `jax.jit` it had before. Nothing is shrunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, class_images

SOURCE = "google/flax examples/vae/models.py + examples/vae/train.py"
LATENTS = 20


class Encoder(nnx.Module):
    """x (B, 784) -> (mean, logvar), each (B, latents)."""

    def __init__(self, latents: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(784, 500, rngs=rngs)
        self.fc2_mean = nnx.Linear(500, latents, rngs=rngs)
        self.fc2_logvar = nnx.Linear(500, latents, rngs=rngs)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nnx.relu(self.fc1(x))
        return self.fc2_mean(x), self.fc2_logvar(x)


class Decoder(nnx.Module):
    """z (B, latents) -> pixel logits (B, 784)."""

    def __init__(self, latents: int, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(latents, 500, rngs=rngs)
        self.fc2 = nnx.Linear(500, 784, rngs=rngs)

    def __call__(self, z: jax.Array) -> jax.Array:
        return self.fc2(nnx.relu(self.fc1(z)))


def reparameterize(rng: jax.Array, mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """z = mean + eps * exp(logvar / 2), eps ~ N(0, 1)."""
    std = jnp.exp(0.5 * logvar)
    eps = jax.random.normal(rng, logvar.shape)
    return mean + eps * std


class VAE(nnx.Module):
    """`model(x, z_rng) -> (recon logits, mean, logvar)`."""

    def __init__(self, latents: int = LATENTS, *, rngs: nnx.Rngs):
        self.encoder = Encoder(latents, rngs=rngs)
        self.decoder = Decoder(latents, rngs=rngs)

    def __call__(self, x: jax.Array, z_rng: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        mean, logvar = self.encoder(x)
        z = reparameterize(z_rng, mean, logvar)
        return self.decoder(z), mean, logvar

    def generate(self, z: jax.Array) -> jax.Array:
        return nnx.sigmoid(self.decoder(z))


@jax.vmap
def kl_divergence(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    return -0.5 * jnp.sum(1 + logvar - jnp.square(mean) - jnp.exp(logvar))


@jax.vmap
def binary_cross_entropy_with_logits(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logits = nnx.log_sigmoid(logits)
    return -jnp.sum(labels * logits + (1.0 - labels) * jnp.log(-jnp.expm1(logits)))


def loss_fn(model: VAE, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """BCE + KLD, each summed per image and averaged over the batch."""
    recon_x, mean, logvar = model(batch["image"], key)
    bce_loss = binary_cross_entropy_with_logits(recon_x, batch["image"]).mean()
    kld_loss = kl_divergence(mean, logvar).mean()
    return bce_loss + kld_loss, {"bce": bce_loss, "kld": kld_loss}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """Binarized-MNIST-shaped: image float32 (784,) of 0s and 1s."""
    image, _ = class_images(n, seed, (784,))
    return {"image": (image > 0.5).astype(np.float32)}


MODEL = ZooModel(
    name="vae",
    source=SOURCE,
    make_model=lambda seed: VAE(rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.adam(1e-3),
    batch_size=128,
    hand_jit="jit",
)
