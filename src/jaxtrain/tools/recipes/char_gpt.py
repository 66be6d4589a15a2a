"""`char-gpt`: a character-level GPT on Tiny Shakespeare, nanoGPT's `shakespeare_char` workload.

Presets (`--preset`):
  baby: nanoGPT's documented CPU configuration — block 64, batch 12, 4 layers, 4 heads,
        embedding 128, dropout 0, 2000 iterations, AdamW lr 1e-3 → 1e-4 (cosine over 2000,
        warmup 100), betas (0.9, 0.99), weight decay 0.1, gradient clip 1.0. nanoGPT's PyTorch
        code reaches validation loss 1.886 at iteration 2000 with it.
  seed: a learning project's first model — block 32, batch 16, 1 layer, 4 heads, embedding 64,
        5000 steps at lr 1e-4 (it overfits; the loss plot shows where).
  long: the baby model at long context — block 1024 (see `LONG`); what `--remat` is for.

Samples are all windows of block_size + 1 characters of the training text, held as their start
positions (4 MB) and gathered from the text inside the compiled step (`window_tokens`). An
"epoch" is `steps_per_epoch` (250) iterations on windows drawn without replacement; validation
loss is then estimated on a fixed set of `eval_batches` batches of validation windows, like
nanoGPT's `estimate_loss` (which draws new random batches each time).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

from jaxtrain import ConfigError, DataConfig, OptimConfig
from jaxtrain.models import GPTConfig
from jaxtrain.tools.recipes.base import Recipe, RecipeConfig, Workload

if TYPE_CHECKING:  # JAX and NumPy are imported by the functions that use them: the configs and --help need none
    import jax
    import numpy as np
    from flax import nnx

    from jaxtrain.data import CharTokenizer
    from jaxtrain.models import GPT


@dataclasses.dataclass(frozen=True)
class TextDataConfig(DataConfig):
    """Tiny Shakespeare at character level (90/10 train/validation split)."""

    eval_batches: int = 200
    """Validation batches of batch_size windows in the loss estimate (nanoGPT's eval_iters)."""
    limit: int = 0
    """Use only the first N characters of the text (0: all); for smoke tests."""
    seed: int = 1337
    """Seed of the choice of validation windows."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_batches < 1:
            raise ConfigError(f"data.eval_batches={self.eval_batches} must be an integer >= 1")
        if self.limit < 0:
            raise ConfigError(f"data.limit={self.limit} must be an integer >= 0")
        if self.seed < 0:
            raise ConfigError(f"data.seed={self.seed} must be an integer >= 0")


@dataclasses.dataclass(frozen=True)
class CharGPTConfig(RecipeConfig):
    """char-gpt: a GPT decoder on Tiny Shakespeare characters (defaults: the baby preset)."""

    preset: str = "baby"
    """The named preset these defaults came from (baby, seed or long; choose with --preset)."""
    epochs: int = 8
    steps_per_epoch: int = 250
    batch_size: int = 12
    eval_batch_size: int = 48
    """Windows per evaluation batch. An estimate (200 batches of 12: 2400 windows) is one compiled
    call over batches of this size. `jaxtrain train char-gpt --epochs 3 --steps-per-epoch 20
    --eval-batch-size B --quiet`, twice each on the 2-core CI machine kind: an estimate took
    2.81-3.15 s at 48, 3.21-3.54 at 240 (the old default), 3.21-3.38 at 24, 3.26-3.61 at 12; the
    same validation losses."""
    log_every: int = 50
    optim: OptimConfig = OptimConfig(
        name="adamw", lr=1e-3, schedule="warmup-cosine", warmup_steps=100, decay_steps=2000, min_lr=1e-4,
        b1=0.9, b2=0.99, weight_decay=0.1, clip_norm=1.0,
    )
    model: GPTConfig = GPTConfig()
    """Model shape."""
    data: TextDataConfig = TextDataConfig()
    """Dataset settings."""


BABY = CharGPTConfig()
SEED = CharGPTConfig(
    preset="seed", epochs=20, batch_size=16, eval_batch_size=320,
    optim=dataclasses.replace(BABY.optim, lr=1e-4, decay_steps=5000, min_lr=1e-5),
    model=GPTConfig(block_size=32, n_layer=1, n_head=4, n_embd=64),
)
LONG = CharGPTConfig(
    preset="long", epochs=4, batch_size=4, eval_batch_size=16,
    optim=dataclasses.replace(BABY.optim, decay_steps=1000),
    model=dataclasses.replace(BABY.model, block_size=1024),
    data=TextDataConfig(eval_batches=50),
)
"""The baby model (4 layers, 4 heads, 128 wide) with a context of 1024 characters.

Batch 4 makes 4,096 tokens a step (the baby's 768 × 5.3): at T = 1024 attention dominates, and its
(B, nh, T, T) scores and probabilities, 64 MiB each per layer at batch 4, are most of the step's
memory (1028 MiB of temporaries per step; 276 MiB with `--remat blocks`, `jaxtrain bench remat`).
A step takes about 3 s on a busy 2-core CPU, so 1000 steps (4 epochs of 250; 4.1M tokens, 2.7× the
baby's 2000 × 768) with the baby's learning rate schedule, its cosine over those 1000 steps.
Evaluation: 50 batches of 4 windows (200 windows, 205k tokens, like the baby's 154k), 16 windows
per evaluation call (the baby's 48 would hold 0.8 GiB of scores per layer). The training windows
are gathered from the text in the step: stored whole they would take 1 GB at this length.
"""


def text_ids(config: CharGPTConfig) -> tuple[np.ndarray, np.ndarray, CharTokenizer]:
    """(train ids, validation ids, tokenizer): the first 90% of the text and the rest, cut to
    `data.limit` characters in the same proportion when it is set."""
    from jaxtrain.data import load_tinyshakespeare

    train_ids, val_ids, tokenizer = load_tinyshakespeare()
    if config.data.limit:
        cut = int(len(train_ids) * config.data.limit / (len(train_ids) + len(val_ids)))
        train_ids, val_ids = train_ids[:cut], val_ids[: config.data.limit - cut]
    length = config.model.block_size + 1
    if min(len(train_ids), len(val_ids)) < length:
        raise ConfigError(f"the text has {len(train_ids)} training and {len(val_ids)} validation tokens, fewer than "
                          f"one window of {length}; raise data.limit")
    return train_ids, val_ids, tokenizer


def window_tokens(ids: np.ndarray, length: int) -> Callable[[dict], dict]:
    """The `preprocess` that turns a batch of window starts into windows: `{"start": (B,)}` ->
    `{"tokens": (B, length)}`, `ids[start : start + length]` each, gathered inside the compiled step.

    The samples are start positions (4 bytes each) and the text is a constant of the program (1.1 MB),
    rather than every window stored whole: 65 MB at the baby's block of 64, 1 GB at the long
    preset's 1024 (PyTorch's twin takes the same windows as views of the text).
    """
    import jax.numpy as jnp
    import numpy as np

    text = np.asarray(ids, np.uint8)  # a host constant: the same program on any device or mesh
    offsets = np.arange(length, dtype=np.int32)

    def preprocess(batch: dict) -> dict:
        return {"tokens": jnp.asarray(text)[batch["start"][:, None] + offsets]}

    return preprocess


def lm_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
    """Mean next-character cross-entropy over the batch's B·T positions."""
    import jax.numpy as jnp
    import optax

    tokens = batch["tokens"].astype(jnp.int32)  # (B, T + 1)
    logits = model(tokens[:, :-1], key).astype(jnp.float32)  # (B, T, V); float32 whatever the compute dtype
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), {}


def build(config: CharGPTConfig) -> Workload:
    import numpy as np

    train_ids, val_ids, tokenizer = text_ids(config)
    length = config.model.block_size + 1
    train = {"start": _starts(np.arange(len(train_ids) - length + 1))}  # every window of the training text
    rng = np.random.default_rng(config.data.seed)
    n_windows = len(val_ids) - length + 1
    n_val = min(config.data.eval_batches * config.batch_size, n_windows)
    val = {"start": _starts(len(train_ids) + np.sort(rng.choice(n_windows, n_val, replace=False)))}
    info = {"vocabulary": tokenizer.chars}
    return Workload(build_model(config, info), lm_loss, train, val,
                    preprocess=window_tokens(np.concatenate([train_ids, val_ids]), length), tokenizer=tokenizer,
                    info=info, inputs="tokens", predict_preprocess=False,
                    input_sample=((config.model.block_size,), "int32"))


def _starts(positions: np.ndarray) -> np.ndarray:
    import numpy as np

    from jaxtrain.data import aligned_empty

    out = aligned_empty(positions.shape, np.int32)  # on a CPU, the device uses it in place: no second copy
    out[...] = positions
    return out


def build_model(config: CharGPTConfig, info: dict) -> GPT:
    from flax import nnx

    from jaxtrain.models import GPT

    return GPT(len(info["vocabulary"]), config.model, remat=config.remat, rngs=nnx.Rngs(config.seed))


RECIPE = Recipe(
    name="char-gpt",
    description="character-level GPT on Tiny Shakespeare (presets: baby = nanoGPT's CPU config, seed, long)",
    config=BABY,
    build=build,
    model=build_model,
    presets={"baby": BABY, "seed": SEED, "long": LONG},
)
