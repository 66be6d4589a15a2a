"""PyTorch mirrors of jaxtrain's CNN and GPT, and the PyTorch side of `jaxtrain bench frameworks`.

The models copy `jaxtrain.models.CNN` and `jaxtrain.models.gpt.GPT` layer by layer, with the
same parameter names, and take their initial weights from the JAX model (`load_jax_params`), so
both frameworks start from identical weights. `train` runs one benchmark run, PyTorch eager or
torch.compile, from the arrays and settings the driver (`frameworks.py`) prepared with JAX: the
data, the initial weights, every step's rows and learning rate, and a batch with JAX's logits
for the forward check.

The driver runs this file as a script (`run_child`: `python torch_models.py --child JSON`), not
as a module of a package that imports JAX (about 190 MB), which would inflate the PyTorch child's
peak RSS. So this module imports only the standard library, NumPy, torch (the optional
`jaxtrain[bench]` extra) and its sibling `child.py` (which loads no JAX).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

if __package__:  # imported as benchmarks.torch_models
    from benchmarks.child import child_main, peak_rss_mib
else:  # run as a script (`python -P`, see child.run_child): `child` loads no JAX
    import importlib.util

    _spec = importlib.util.spec_from_file_location("child", Path(__file__).with_name("child.py"))
    _child = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_child)
    child_main, peak_rss_mib = _child.child_main, _child.peak_rss_mib

FORWARD_TOLERANCE = 1e-4  # max |logit difference| / max |JAX logit| on the initial weights, float32


class CNN(nn.Module):
    """`jaxtrain.models.CNN`: Conv(32) → ReLU → avg-pool 2 → Conv(64) → ReLU → avg-pool 2 → Dense(256) → ReLU →
    Dense(10). Takes NCHW images, torch's layout (a permuted NHWC input sends the convolutions down a path
    3.5× slower on CPU, measured); permutes to NHWC before the flatten so that dense1's weights line up."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)  # stride 1, 'SAME' for 3×3
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.dense1 = nn.Linear(7 * 7 * 64, 256)
        self.dense2 = nn.Linear(256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 28, 28) -> (B, 10)
        x = F.avg_pool2d(F.relu(self.conv1(x)), 2)  # (B, 32, 14, 14)
        x = F.avg_pool2d(F.relu(self.conv2(x)), 2)  # (B, 64, 7, 7)
        x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # (B, 3136) in (h, w, c) order, as the JAX model flattens
        return self.dense2(F.relu(self.dense1(x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # each (B, T, C)
        q, k, v = (a.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for a in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs), scale 1/sqrt(hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLPBlock(nn.Module):
    def __init__(self, n_embd: int, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        return self.c_proj(F.gelu(self.c_fc(x), approximate="none"))  # exact (erf) GELU, as the JAX model


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, bias)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5, bias=bias)
        self.mlp = MLPBlock(n_embd, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    """`jaxtrain.models.gpt.GPT`: token + position embeddings, pre-LN blocks, final LayerNorm, output
    layer tied to the token embedding. `config` holds GPTConfig's fields."""

    def __init__(self, vocab_size: int, config: dict[str, Any]):
        super().__init__()
        C = config["n_embd"]
        self.wte = nn.Embedding(vocab_size, C)
        self.wpe = nn.Embedding(config["block_size"], C)
        self.drop = nn.Dropout(config["dropout"])
        self.blocks = nn.ModuleList(
            Block(C, config["n_head"], config["dropout"], config["bias"]) for _ in range(config["n_layer"])
        )
        self.ln_f = nn.LayerNorm(C, eps=1e-5, bias=config["bias"])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) int64 -> (B, T, V)
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # (B, T, V): tied output layer


def load_jax_params(model: nn.Module, params: dict[str, np.ndarray]) -> None:
    """Copies JAX parameters, named by their module path (`conv1.kernel`, `blocks.0.ln_1.scale`), into
    `model`, whose modules carry the same names.

    Layouts: conv kernel HWIO → weight OIHW; Linear kernel (in, out) → weight (out, in); embeddings
    and LayerNorm scales as they are (`embedding`/`scale` → `weight`).

    Raises:
      ValueError: a name or shape that does not match, or a torch parameter left without a value.
    """
    targets = dict(model.named_parameters())  # the tied lm_head is wte.weight, listed once
    assigned = set()
    with torch.no_grad():
        for name, value in params.items():
            module, leaf = name.rsplit(".", 1)
            target = f"{module}.{'bias' if leaf == 'bias' else 'weight'}"
            if leaf == "kernel":
                # conv HWIO -> OIHW; linear (in, out) -> (out, in)
                value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T
            if target not in targets or tuple(targets[target].shape) != value.shape:
                found = tuple(targets[target].shape) if target in targets else "no such parameter"
                raise ValueError(f"JAX parameter {name} {value.shape} does not fit torch {target} ({found})")
            targets[target].copy_(torch.tensor(np.asarray(value, np.float32)))
            assigned.add(target)
    missing = sorted(set(targets) - assigned)
    if missing:
        raise ValueError(f"torch parameters without a JAX value: {', '.join(missing)}")


def build_torch_optimizer(model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
    """The torch counterpart of `jaxtrain.optim.build_optimizer` for OptimConfig's fields `optim`.

    Weight decay only on ndim >= 2 parameters (two groups, as `decay_mask`): L2 added to the gradient
    for sgd and adam (optax.add_decayed_weights), decoupled for adamw. The learning rate is set by the
    caller before every step. Adam and AdamW use torch's fused CPU kernels (the fastest option).
    """
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": ps, "weight_decay": wd} for ps, wd in ((decay, optim["weight_decay"]), (rest, 0.0)) if ps]
    if optim["name"] == "sgd":
        return torch.optim.SGD(groups, lr=0.0, momentum=optim["momentum"])
    cls = torch.optim.Adam if optim["name"] == "adam" else torch.optim.AdamW
    return cls(groups, lr=0.0, betas=(optim["b1"], optim["b2"]), eps=optim["eps"], fused=True)


def train_step(task: Any, loss_fn: Callable, optimizer: torch.optim.Optimizer, parameters: list[torch.Tensor],
               rows: torch.Tensor, lr: float, clip: float,
               update_scope: Callable = contextlib.nullcontext) -> torch.Tensor:
    """One training step as every benchmark runs it: gather the batch's rows, set the learning
    rate, forward, backward, then clip and update inside `update_scope()` (e.g. a profiler label).
    Returns the loss."""
    batch = task.gather(rows)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = loss_fn(*batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    with update_scope():
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(parameters, clip)
        optimizer.step()
    return loss


class ImageTask:
    """mnist-cnn: uint8 images standardised inside the step (as the recipe's preprocess), cross-entropy."""

    def __init__(self, spec: dict[str, Any], arrays: Any):
        self.model = CNN()
        self.mean, self.std = spec["normalisation"]
        self.train = (torch.from_numpy(arrays["train_image"]), torch.from_numpy(arrays["train_label"].astype(np.int64)))
        self.val = (torch.from_numpy(arrays["val_image"]), torch.from_numpy(arrays["val_label"].astype(np.int64)))

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:  # uint8 (B, 28, 28) -> float32 (B, 1, 28, 28)
        return ((images.to(torch.float32) / 255.0 - self.mean) / self.std)[:, None]

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(a[rows] for a in self.train)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.model(self.preprocess(images)), labels)

    def metrics(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = self.model(self.preprocess(images))  # (B, 10)
        return F.cross_entropy(logits, labels), (logits.argmax(-1) == labels).to(torch.float32).mean()

    metric_names = ("loss", "accuracy")

    def check_forward(self, x: np.ndarray) -> torch.Tensor:
        return self.model(self.preprocess(torch.from_numpy(x)))


class TextTask:
    """char-gpt: windows of T + 1 tokens (input [:, :-1], targets [:, 1:]), next-token cross-entropy."""

    def __init__(self, spec: dict[str, Any], arrays: Any):
        self.model = GPT(spec["vocab_size"], spec["model"])
        T = spec["model"]["block_size"]
        # Training window r is ids[r : r + T + 1], as the recipe's `windows`; a view, gathered per step.
        self.train = (torch.from_numpy(arrays["train_ids"]).unfold(0, T + 1, 1),)  # (N, T + 1) uint8
        self.val = (torch.from_numpy(arrays["val_tokens"]),)
        self.vocab_size = spec["vocab_size"]

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.train[0][rows],)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(torch.int64)  # (B, T + 1)
        logits = self.model(tokens[:, :-1])  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), tokens[:, 1:].reshape(-1))

    def metrics(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.loss(tokens),)

    metric_names = ("loss",)

    def check_forward(self, x: np.ndarray) -> torch.Tensor:
        return self.model(torch.from_numpy(x).to(torch.int64))


TASKS = {"mnist-cnn": ImageTask, "char-gpt": TextTask}


def forward_check(task: Any, x: np.ndarray, jax_logits: np.ndarray) -> dict[str, Any]:
    """Compares the torch logits on the initial weights with JAX's: max |Δ| / max |JAX logit|."""
    with torch.no_grad():
        logits = task.check_forward(x).numpy()
    diff = float(np.max(np.abs(logits.astype(np.float64) - jax_logits)) / np.max(np.abs(jax_logits)))
    return {"max_rel_diff": diff, "tolerance": FORWARD_TOLERANCE, "passed": diff <= FORWARD_TOLERANCE}


def _evaluate(task: Any, fn: Callable, eval_batch_size: int) -> dict[str, float]:
    """Exact means over the validation set in batches of eval_batch_size (the last one smaller), as
    `jaxtrain.step.make_evaluate`."""
    n = len(task.val[0])
    totals = [0.0] * len(task.metric_names)
    task.model.eval()
    with torch.no_grad():
        for start in range(0, n, eval_batch_size):
            batch = tuple(a[start : start + eval_batch_size] for a in task.val)
            for i, value in enumerate(fn(*batch)):
                totals[i] += float(value) * len(batch[0])
    task.model.train()
    return {f"val_{name}": total / n for name, total in zip(task.metric_names, totals)}


def train(spec: dict[str, Any], variant: str, mode: str = "default") -> dict[str, Any]:
    """One benchmark run of `variant` (torch-eager or torch-compile) on the prepared workload `spec`.

    Every step is timed on its own (torch on the CPU runs synchronously): gather the rows, set the
    learning rate, forward, backward, clip, optimizer step. torch-eager counts every step. For
    torch-compile, the first training step traces and compiles the forward and backward graphs: its
    time minus the mean of the other steps is compile time, and training time is N × that mean;
    the evaluation graphs are compiled before training on one batch of each evaluation shape (also
    compile time), so evaluation times hold no compilation. `mode` is torch.compile's.
    """
    torch.set_num_threads(os.cpu_count() or 1)
    arrays = np.load(spec["arrays"])
    task = TASKS[spec["workload"]](spec, arrays)
    load_jax_params(task.model, {k.removeprefix("params/"): arrays[k] for k in arrays.files if k.startswith("params/")})
    check = forward_check(task, arrays["check_input"], arrays["check_logits"])
    optimizer = build_torch_optimizer(task.model, spec["optim"])
    parameters = list(task.model.parameters())
    clip = spec["optim"]["clip_norm"]
    rows = torch.from_numpy(arrays["rows"])  # (steps, B): fit's batch order, computed with JAX
    lrs = arrays["lr"].tolist()  # build_schedule(config.optim, total_steps)(step), computed with JAX
    loss_fn, metrics_fn = task.loss, task.metrics
    eval_B = spec["eval_batch_size"]
    compile_s = 0.0
    if variant == "torch-compile":
        mode = None if mode == "default" else mode
        loss_fn = torch.compile(task.loss, dynamic=False, mode=mode)
        metrics_fn = torch.compile(task.metrics, dynamic=False, mode=mode)
        n_val = len(task.val[0])
        t0 = time.perf_counter()
        task.model.eval()
        with torch.no_grad():  # one batch of each evaluation shape: full batches and the remainder
            for start in sorted({0, (n_val // eval_B) * eval_B} - {n_val}):
                metrics_fn(*(a[start : start + eval_B] for a in task.val))
        task.model.train()
        compile_s += time.perf_counter() - t0
    elif variant != "torch-eager":
        raise ValueError(f"unknown variant {variant!r}")

    task.model.train()
    times: list[float] = []
    intervals: list[dict[str, Any]] = []
    step = 0
    epochs, steps_per_epoch = spec["epochs"], spec["steps_per_epoch"]
    for epoch in range(1, epochs + 1):
        losses = []
        for _ in range(steps_per_epoch):
            t0 = time.perf_counter()
            loss = train_step(task, loss_fn, optimizer, parameters, rows[step], lrs[step], clip)
            losses.append(loss.detach())
            times.append(time.perf_counter() - t0)
            step += 1
        record: dict[str, Any] = {"epoch": epoch, "step": step, "train_s": sum(times[-steps_per_epoch:]),
                                  "train_loss": float(torch.stack(losses).to(torch.float64).mean())}
        t0 = time.perf_counter()
        if epoch % spec["eval_every"] == 0 or epoch == epochs:
            record.update(_evaluate(task, metrics_fn, eval_B))
        record["eval_s"] = time.perf_counter() - t0
        intervals.append(record)

    first_step_s = times[0]
    if variant == "torch-compile" and len(times) > 1:
        steady = sum(times[1:]) / (len(times) - 1)
        excess = max(times[0] - steady, 0.0)
        compile_s += excess
        intervals[0]["train_s"] -= excess
    result: dict[str, Any] = {
        "train_s": sum(r["train_s"] for r in intervals), "compile_s": compile_s, "first_step_s": first_step_s,
        "steps": step, "intervals": intervals, "forward_check": check, "peak_rss_mib": peak_rss_mib(),
        "threads": torch.get_num_threads(), "device": "cpu", "torch_version": torch.__version__,
    }
    if variant == "torch-compile":
        from torch._dynamo.utils import counters

        result["graphs_compiled"] = int(counters["stats"].get("unique_graphs", 0))
        if len(times) > 1:  # a slow later step would show a recompilation (or a pause of the machine)
            slowest = max(range(1, len(times)), key=times.__getitem__)
            result["slowest_later_step"] = {"step": slowest + 1, "seconds": times[slowest]}
    return result


if __name__ == "__main__":  # errors (e.g. torch.compile failing) are reported to the driver, which goes on
    child_main(lambda payload: train(json.loads(Path(payload["spec"]).read_text()), payload["variant"],
                                     payload.get("mode", "default")))
