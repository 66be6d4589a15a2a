"""`jaxtrain bench frameworks`: jaxtrain against PyTorch (eager and torch.compile) on two recipes.

Workloads: `mnist-cnn` (one epoch, test accuracy at the end) and `char-gpt` preset baby (2000
iterations, validation loss every 250). Variants: `jaxtrain` (the recipe through `jaxtrain.fit`),
`torch-eager` and `torch-compile` (the models of `torch_models`). All three train the same
architecture from the same initial weights (copied from the JAX model, checked by comparing the
forward pass), on the same batches in the same order (`batch_rows`: fit's permutations), with the
same optimizer and the same learning rate at every step (`jaxtrain.optim.build_schedule`).

Each run is a fresh process; variants are interleaved (run 1 of every variant, then run 2, ...).
jaxtrain's children use the persistent compilation cache as the `jaxtrain` command does: the user's,
so that every run after the first loads its programs from it; `--cold` gives each compiling child a
fresh, empty cache directory instead, so that each compiles everything, as a user's first run does.
Times exclude compilation: jaxtrain's are fit's `train_time_s` (compiled ahead of time; evaluation
excluded); torch-compile's are described in `torch_models.train`. FLOP utilisation is model FLOPs
per step / time per step / this machine's float32 matmul rate (measured as the ladder does).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.child import child_main, peak_rss_mib, run_child, torch_available
from jaxtrain._src.errors import ConfigError

WORKLOADS = ("mnist-cnn", "char-gpt")
VARIANTS = ("jaxtrain", "torch-eager", "torch-compile")
BASELINE = "jaxtrain-baseline"  # jaxtrain from another checkout (`--baseline-src`)
TORCH_SCRIPT = Path(__file__).with_name("torch_models.py")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CHECK_BATCH = {"mnist-cnn": 16, "char-gpt": 4}  # samples in the torch-vs-JAX forward check
QUICK = {  # --quick: a few steps on a small slice of the data, evaluation on a few batches; char-gpt with
    # one transformer block (the same ops as the baby's four, a quarter of the compiling and training)
    "mnist-cnn": {"epochs": 2, "steps_per_epoch": 3, "data": {"limit": 1536}},
    "char-gpt": {"epochs": 2, "steps_per_epoch": 3, "data": {"limit": 20_000, "eval_batches": 2},
                 "model": {"n_layer": 1}},
}


@dataclasses.dataclass(frozen=True)
class FrameworksConfig:
    """Settings of the jaxtrain-vs-PyTorch benchmark."""

    workloads: str = "mnist-cnn,char-gpt"
    """Comma-separated workloads: mnist-cnn (1 epoch, test accuracy), char-gpt (baby preset, 2000 iterations)."""
    variants: str = "jaxtrain,torch-eager,torch-compile"
    """Comma-separated variants: jaxtrain, torch-eager, torch-compile (torch variants need `pip install torch`)."""
    runs: int = 5
    """Runs of each variant, each in a fresh process, interleaved across variants."""
    torch_compile_mode: str = "default"
    """torch.compile's mode: default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs."""
    steps: int = 0
    """Training steps (0: the workload's default). At most one evaluation interval (mnist-cnn: one epoch,
    char-gpt: 250) or a multiple of it."""
    target_val_loss: float = 1.89
    """char-gpt: report the time at which validation loss first reached this (nanoGPT: 1.886 at 2000)."""
    out: str = "bench-results/frameworks"
    """Directory for results.json, results.md and frameworks.png."""
    quick: bool = False
    """A cut-down run for smoke tests: 2 × 3 steps on a data slice (char-gpt: 1 layer), 1 run, no torch-compile."""
    cold: bool = False
    """Give every compiling child (jaxtrain's, torch.compile's) a fresh, empty compilation cache directory, so
    that each compiles its programs as a user's first run does (a first run's peak memory and compile time);
    without it the children share the user's caches, and runs after the first load their programs from them."""
    baseline_src: str = ""
    """Also run jaxtrain from another checkout's src/ directory (a git worktree of an earlier commit) as the
    variant jaxtrain-baseline, interleaved with the others and with this checkout's recipe settings: what a
    change did to step time and peak memory."""

    def __post_init__(self) -> None:
        for field, allowed in (("workloads", WORKLOADS), ("variants", VARIANTS)):
            names = _names(getattr(self, field))
            unknown = [n for n in names if n not in allowed]
            if unknown or not names:
                raise ConfigError(f"{field}={getattr(self, field)!r}: choose a comma-separated subset of "
                                  f"{','.join(allowed)}")
        if self.torch_compile_mode not in COMPILE_MODES:
            raise ConfigError(f"torch_compile_mode={self.torch_compile_mode!r}: choose one of "
                              f"{', '.join(COMPILE_MODES)}")
        if not isinstance(self.runs, int) or self.runs < 1:
            raise ConfigError(f"runs={self.runs!r} must be an integer >= 1")
        if self.baseline_src and not (Path(self.baseline_src) / "jaxtrain" / "__init__.py").is_file():
            raise ConfigError(f"baseline_src={self.baseline_src!r} holds no jaxtrain package; give the src/ "
                              "directory of another checkout (e.g. `git worktree add DIR COMMIT`, then DIR/src)")
        if not isinstance(self.steps, int) or self.steps < 0:
            raise ConfigError(f"steps={self.steps!r} must be an integer >= 1, or 0 for the workload's default")


def _names(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def cnn_train_flops_per_sample() -> int:
    """Model FLOPs of one training sample of `jaxtrain.models.CNN`: 3 × the forward pass's
    multiply-adds (2 FLOPs each) in the convolutions and dense layers; the backward pass costs about
    2 × the forward (gradients of activations and of weights). Biases, ReLU, pooling and the loss are
    left out; conv1's input gradient, which is never needed, is counted, as the 3× convention does."""
    conv1 = 28 * 28 * (3 * 3 * 1) * 32  # output positions × (kh·kw·C_in) × C_out
    conv2 = 14 * 14 * (3 * 3 * 32) * 64
    dense1 = 7 * 7 * 64 * 256
    dense2 = 256 * 10
    return 3 * 2 * (conv1 + conv2 + dense1 + dense2)


def batch_rows(seed: int, n_train: int, batch_size: int, steps_per_epoch: int, epochs: int) -> np.ndarray:
    """The rows every step of `jaxtrain.fit` trains on: (epochs · steps_per_epoch, B) int64.

    fit splits `key(seed)` into (step key, data key); epoch e (1-based) visits the samples in the order
    `epoch_permutation(data_key, e, n_train)`, and its step i takes rows perm[i·B : (i+1)·B].
    """
    import jax

    from jaxtrain._src.feeds import epoch_permutation

    data_key = jax.random.split(jax.random.key(seed))[1]
    used = steps_per_epoch * batch_size
    per_epoch = [epoch_permutation(data_key, e, n_train)[:used].reshape(steps_per_epoch, batch_size)
                 for e in range(1, epochs + 1)]
    return np.concatenate(per_epoch).astype(np.int64)


def _recipe_config(workload: str, config: FrameworksConfig):
    """The recipe and its config for `workload` before the step count is applied: quiet, no checkpoints."""
    from jaxtrain.tools.recipes import get_recipe

    recipe = get_recipe(workload)
    base = recipe.presets["baby"] if workload == "char-gpt" else dataclasses.replace(recipe.config, epochs=1)
    base = dataclasses.replace(base, quiet=True, checkpoint=dataclasses.replace(base.checkpoint, enabled=False))
    if config.quick:
        quick = QUICK[workload]
        base = dataclasses.replace(base, epochs=quick["epochs"], steps_per_epoch=quick["steps_per_epoch"],
                                   data=dataclasses.replace(base.data, **quick["data"]))
        if "model" in quick:
            base = dataclasses.replace(base, model=dataclasses.replace(base.model, **quick["model"]))
    return recipe, base


def _with_steps(workload: str, recipe_config: Any, steps: int, n_train: int) -> Any:
    """`recipe_config` training for `steps` steps, evaluating at the same interval as the recipe."""
    from jaxtrain._src.feeds import epoch_steps

    if not steps:
        return recipe_config
    interval, _ = epoch_steps(recipe_config, n_train)
    if steps <= interval:
        return dataclasses.replace(recipe_config, epochs=1, steps_per_epoch=steps)
    if steps % interval == 0:
        return dataclasses.replace(recipe_config, epochs=steps // interval)
    raise ConfigError(f"steps={steps}: {workload} evaluates every {interval} steps; use at most {interval} "
                      f"or a multiple of it")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A workload ready to run: its resolved recipe config and the torch children's spec file."""

    workload: str
    recipe_config: dict[str, Any]
    spec_path: Path
    steps: int
    steps_per_epoch: int
    batch_size: int
    flops_per_step: float
    n_train: int
    n_val: int


def prepare(workload: str, config: FrameworksConfig, directory: Path) -> Prepared:
    """Builds the workload with JAX and writes what the torch children need: the data, the initial
    weights, every step's rows and learning rate, and a batch with JAX's logits for the forward check."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxtrain._src.config import to_dict
    from jaxtrain._src.data import num_samples
    from jaxtrain._src.feeds import epoch_steps
    from jaxtrain._src.models.gpt import num_params, train_flops_per_token
    from jaxtrain._src.optim import build_schedule
    from jaxtrain.tools.recipes.char_gpt import text_ids
    from jaxtrain.tools.recipes.mnist_cnn import NORMALISATION

    recipe, rconfig = _recipe_config(workload, config)
    w = recipe.build(rconfig)
    n_train, n_val = num_samples(w.train, "train"), num_samples(w.val, "val")
    rconfig = _with_steps(workload, rconfig, config.steps, n_train)
    spe, _ = epoch_steps(rconfig, n_train)
    B, steps = rconfig.batch_size, rconfig.epochs * spe
    schedule = build_schedule(rconfig.optim, steps)
    params = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(w.model, nnx.Param)):
        name = ".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
        params[f"params/{name}"] = np.asarray(leaf, np.float32)
    arrays: dict[str, np.ndarray] = {
        **params,
        "rows": batch_rows(rconfig.seed, n_train, B, spe, rconfig.epochs),
        "lr": np.broadcast_to(np.asarray(jax.vmap(schedule)(jnp.arange(steps)), np.float64), (steps,)),
    }
    spec: dict[str, Any] = {
        "workload": workload, "epochs": rconfig.epochs, "steps_per_epoch": spe, "eval_every": rconfig.eval_every,
        "eval_batch_size": min(rconfig.eval_batch_size or B, n_val), "optim": dataclasses.asdict(rconfig.optim),
    }
    graphdef, state = nnx.split(w.model)
    forward = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))  # compiled once: faster than op by op
    k = CHECK_BATCH[workload]
    if workload == "mnist-cnn":
        arrays.update(train_image=w.train["image"], train_label=w.train["label"], val_image=w.val["image"],
                      val_label=w.val["label"], check_input=w.train["image"][:k])
        image = w.preprocess({"image": jnp.asarray(w.train["image"][:k])})["image"]  # (k, 28, 28, 1)
        arrays["check_logits"] = np.asarray(forward(state, image), np.float64)
        spec["normalisation"] = NORMALISATION[rconfig.data.dataset]
        flops = cnn_train_flops_per_sample() * B
    else:
        train_ids, _, _ = text_ids(rconfig)  # window r of the training set is ids[r : r + T + 1]
        windows = lambda starts: np.asarray(w.preprocess({"start": starts})["tokens"])  # noqa: E731 - as fit's step
        check = windows(w.train["start"][:k])[:, :-1]
        arrays.update(train_ids=train_ids.astype(np.uint8), val_tokens=windows(w.val["start"]), check_input=check)
        arrays["check_logits"] = np.asarray(forward(state, jnp.asarray(check, jnp.int32)), np.float64)
        spec.update(vocab_size=w.tokenizer.vocab_size, model=dataclasses.asdict(rconfig.model))
        flops = train_flops_per_token(rconfig.model, num_params(w.model)) * B * rconfig.model.block_size
    spec["arrays"] = str(directory / f"{workload}.npz")
    np.savez(spec["arrays"], **arrays)
    spec_path = directory / f"{workload}.json"
    spec_path.write_text(json.dumps(spec))
    return Prepared(workload, to_dict(rconfig), spec_path, steps, spe, B, float(flops), n_train, n_val)


def cold_cache_env(variant: str, directory: Path) -> dict[str, str | None]:
    """The environment of a child that compiles as a user's first run does: its compilation cache in
    a new, empty directory under `directory`. jaxtrain's: `JAXTRAIN_COMPILE_CACHE`, with a cache the
    user set for JAX itself (which `enable_compile_cache` would keep) removed from the child's
    environment; torch.compile's: Inductor's (and Triton's) cache. PyTorch eager compiles nothing."""
    if variant == "torch-eager":
        return {}
    fresh = tempfile.mkdtemp(prefix=f"{variant}-cache-", dir=directory)
    if variant == "torch-compile":
        return {"TORCHINDUCTOR_CACHE_DIR": fresh, "TRITON_CACHE_DIR": str(Path(fresh) / "triton")}
    return {"JAXTRAIN_COMPILE_CACHE": fresh, "JAX_COMPILATION_CACHE_DIR": None,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": None}


def jaxtrain_child(workload: str, values: dict[str, Any]) -> dict[str, Any]:
    """One jaxtrain run in this (fresh) process: the recipe's workload through `jaxtrain.fit`, no run
    directory, as `runs.train` would call it."""
    from jaxtrain._src.memory import imports_outside_gc, limit_free_heap, release_compiled_programs

    with imports_outside_gc():  # as the `jaxtrain` command's process does
        from rich.console import Console

        from jaxtrain._src.compile_cache import cache_totals, enable_compile_cache
        from jaxtrain._src.config import from_dict
        from jaxtrain.engine import RunOptions, run
        from jaxtrain.tools.recipes import get_recipe

    cache_dir = enable_compile_cache()  # as the `jaxtrain` command does
    before = cache_totals()  # every thread's: programs also compile in the background
    limit_free_heap()
    recipe = get_recipe(workload)
    config = from_dict(type(recipe.config), values)
    w = recipe.build(config)
    release_compiled_programs()  # as `runs.train` does
    result = run(w.model, w.loss_fn, w.train, w.val, config, preprocess=w.preprocess, augment=w.augment,
                 verbosity="summary",
                 session=RunOptions(name=recipe.name, saved_config=config, console=Console(file=io.StringIO())))
    s = result.summary
    intervals = []
    for r in result.history:
        interval = {"epoch": r["epoch"], "step": r["step"], "train_loss": r["train_loss"],
                    "train_s": r["train_time_s"], "eval_s": r["eval_time_s"]}
        interval.update({k: v for k, v in r.items() if k.startswith("val_")})
        intervals.append(interval)
    return {"train_s": s["train_time_s"], "compile_s": s["compile_time_s"], "steps": s["steps"],
            "steps_per_call": s["steps_per_call"], "intervals": intervals, "peak_rss_mib": peak_rss_mib(),
            "device": s["device"], "jax_version": s["jax_version"],
            "compile_cache": {"dir": None if cache_dir is None else str(cache_dir),
                              **{k: n - before[k] for k, n in cache_totals().items()}}}


def _run_child(prepared: Prepared, variant: str, compile_mode: str = "default", baseline_src: str = "",
               env: dict[str, str | None] | None = None) -> dict[str, Any]:
    if variant == "jaxtrain":
        return run_child("benchmarks.frameworks", {"workload": prepared.workload, "config": prepared.recipe_config},
                         env=env)
    if variant == BASELINE:
        module, path = _baseline_child(baseline_src)
        return run_child(module, {"workload": prepared.workload, "config": _known_fields(prepared, baseline_src)},
                         env={**(env or {}), "PYTHONPATH": path})
    return run_child(TORCH_SCRIPT, {"spec": str(prepared.spec_path), "variant": variant, "mode": compile_mode},
                     env=env)


def _baseline_child(baseline_src: str) -> tuple[str, str]:
    """(module, PYTHONPATH) of the baseline's own child, its jaxtrain and its benchmark from the other checkout:
    `benchmarks/` beside its src/, or, in a checkout from before benchmarks left the package, the
    benchmark under src/jaxtrain/tools/bench/."""
    src = Path(baseline_src).resolve()
    if (src / "jaxtrain" / "tools" / "bench" / "frameworks.py").is_file():
        return "jaxtrain.tools.bench.frameworks", str(src)
    return "benchmarks.frameworks", os.pathsep.join([str(src.parent), str(src)])


def _known_fields(prepared: Prepared, baseline_src: str) -> dict[str, Any]:
    """The config without the settings the baseline's code does not have (settings added since it
    was written, at their defaults; nested ones such as `data.allow_nan` too), so that it reads the rest."""
    from jaxtrain._src.config import to_dict
    from jaxtrain.tools.recipes import get_recipe

    code = ("import json; from jaxtrain._src.config import to_dict; from jaxtrain.tools.recipes import get_recipe; "
            f"print(json.dumps(to_dict(get_recipe({prepared.workload!r}).config), default=str))")
    env = {**os.environ, "PYTHONPATH": str(Path(baseline_src).resolve())}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    known = json.loads(out.stdout.strip().splitlines()[-1])
    defaults = to_dict(type(get_recipe(prepared.workload).config)())
    changed: list[str] = []

    def keep(values: dict[str, Any], known: dict[str, Any], defaults: dict[str, Any], prefix: str) -> dict[str, Any]:
        kept = {}
        for k, v in values.items():
            if k not in known:
                if v != defaults.get(k):
                    changed.append(prefix + k)
            elif isinstance(v, dict) and isinstance(known[k], dict):
                kept[k] = keep(v, known[k], defaults.get(k) or {}, f"{prefix}{k}.")
            else:
                kept[k] = v
        return kept

    kept = keep(prepared.recipe_config, known, defaults, "")
    if changed:
        raise ConfigError(f"the baseline's code has no setting {', '.join(changed)}, which this run changes")
    return kept


def _derive(r: dict[str, Any], prepared: Prepared, peak_gflops: float, target: float) -> None:
    """Adds per-step rates, final metrics, FLOP utilisation and (char-gpt) the time to the target loss."""
    r["ms_per_step"] = r["train_s"] / r["steps"] * 1e3
    r["steps_per_s"] = 1e3 / r["ms_per_step"]
    r["eval_s"] = sum(i["eval_s"] for i in r["intervals"])
    r["mfu"] = prepared.flops_per_step / (r["ms_per_step"] / 1e3) / (peak_gflops * 1e9)
    r["final_train_loss"] = r["intervals"][-1]["train_loss"]
    evaluated = [i for i in r["intervals"] if "val_loss" in i]
    r["final_val_loss"] = evaluated[-1]["val_loss"] if evaluated else None
    if prepared.workload == "mnist-cnn":
        r["final_val_accuracy"] = evaluated[-1]["val_accuracy"] if evaluated else None
    else:
        r["time_to_target_s"] = None  # training + evaluation seconds until the first evaluation <= target
        elapsed = 0.0
        for i in r["intervals"]:
            elapsed += i["train_s"] + i["eval_s"]
            if i.get("val_loss", float("inf")) <= target:
                r["time_to_target_s"] = elapsed
                break


def _summarise(runs: list[dict[str, Any]], workloads: list[str], variants: list[str]) -> list[dict[str, Any]]:
    """Medians, spreads and ratios per workload and variant (ratios: other time / this time, from medians)."""
    rows = []
    for workload in workloads:
        medians = {}
        for variant in variants:
            done = [r for r in runs if r["workload"] == workload and r["variant"] == variant and "error" not in r]
            if not done:
                continue
            ms = [r["ms_per_step"] for r in done]
            row: dict[str, Any] = {
                "workload": workload, "variant": variant, "runs": len(done), "ms_per_step": ms,
                "median_ms_per_step": statistics.median(ms), "min_ms_per_step": min(ms), "max_ms_per_step": max(ms),
                "median_train_s": statistics.median(r["train_s"] for r in done),
                "median_compile_s": statistics.median(r["compile_s"] for r in done),
                "median_eval_s": statistics.median(r["eval_s"] for r in done),
                "median_peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in done),
                "median_mfu": statistics.median(r["mfu"] for r in done),
                "final_train_loss": [r["final_train_loss"] for r in done],
                "final_val_loss": [r["final_val_loss"] for r in done],
            }
            row["steps_per_s"] = 1e3 / row["median_ms_per_step"]
            if workload == "mnist-cnn":
                row["final_val_accuracy"] = [r["final_val_accuracy"] for r in done]
            else:
                row["time_to_target_s"] = [r["time_to_target_s"] for r in done]
            checks = [r["forward_check"] for r in done if "forward_check" in r]
            if checks:
                row["forward_check_max_rel_diff"] = max(c["max_rel_diff"] for c in checks)
                row["forward_check_passed"] = all(c["passed"] for c in checks)
            medians[variant] = row["median_ms_per_step"]
            rows.append(row)
        for row in rows:
            if row["workload"] == workload:
                for base, key in (("torch-eager", "vs_torch_eager"), ("torch-compile", "vs_torch_compile")):
                    row[key] = medians[base] / row["median_ms_per_step"] if base in medians else None
    return rows


def main(config: FrameworksConfig) -> int:
    from rich.console import Console

    from benchmarks.ladder import measure_peak_gflops

    variants = list(_names(config.variants))
    skipped: dict[str, str] = {}
    if config.quick:
        config = dataclasses.replace(config, runs=1)
        if "torch-compile" in variants:
            skipped["torch-compile"] = "not run with --quick (compiling takes minutes on a small CPU)"
    if not torch_available():
        for v in ("torch-eager", "torch-compile"):
            if v in variants:
                skipped.setdefault(v, "torch is not installed (pip install 'jaxtrain[bench]', or torch==2.13.0 on CPU)")
    active = [v for v in variants if v not in skipped]
    if config.baseline_src:
        active.insert(active.index("jaxtrain") + 1 if "jaxtrain" in active else 0, BASELINE)
    workloads = list(_names(config.workloads))
    console = Console(highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() else 180)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)

    peak = measure_peak_gflops()
    machine = _machine()
    console.print(f"frameworks benchmark: {', '.join(workloads)}; {', '.join(active)}; {config.runs} run(s) each, "
                  f"interleaved, fresh process per run; {machine['jax_device']}; matmul peak measured "
                  f"{peak:.0f} GFLOP/s; {cache_mode(config)}")
    for v, why in skipped.items():
        console.print(f"  {v}: skipped, {why}")
    runs: list[dict[str, Any]] = []
    info: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="jaxtrain-frameworks-") as tmp:
        for workload in workloads:
            prepared = prepare(workload, config, Path(tmp))
            info[workload] = {k: v for k, v in dataclasses.asdict(prepared).items() if k != "spec_path"}
            console.print(f"{workload}: {prepared.steps} steps of batch {prepared.batch_size} "
                          f"({prepared.n_train:,} train / {prepared.n_val:,} val samples), evaluation every "
                          f"{prepared.steps_per_epoch} steps; {prepared.flops_per_step / 1e9:.3f} GFLOP per step")
            failed: dict[str, str] = {}
            for run in range(1, config.runs + 1):
                for variant in active:
                    if variant in failed:
                        continue
                    env = cold_cache_env(variant, Path(tmp)) if config.cold else None
                    measured = _run_child(prepared, variant, config.torch_compile_mode, config.baseline_src, env)
                    r = {"workload": workload, "variant": variant, "run": run, **measured}
                    runs.append(r)
                    if "error" in r:
                        failed[variant] = r["error"]
                        console.print(f"  run {run} {variant}: FAILED: {r['error']}; its remaining runs are skipped")
                        continue
                    _derive(r, prepared, peak, config.target_val_loss)
                    console.print(f"  run {run} {variant}: {_run_line(r)}")

    rows = _summarise(runs, workloads, active)
    notes = _notes(runs, rows, skipped, peak, config)
    _write(config, machine, peak, info, runs, rows, notes, console)
    broken = [r for r in runs if ("error" in r and r["variant"] != "torch-compile")
              or not r.get("forward_check", {"passed": True})["passed"]]
    return 1 if broken else 0


def _machine() -> dict[str, Any]:
    import jax

    from jaxtrain._src.report import device_description

    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {"jax_device": device_description(jax.devices()[0]), "cpu_count": os.cpu_count(),
            "jax_version": jax.__version__, "torch_version": torch_version, "torch_device": "cpu"}


def _run_line(r: dict[str, Any]) -> str:
    line = (f"{r['ms_per_step']:.2f} ms/step, train {r['train_s']:.2f} s, compile {r['compile_s']:.2f} s, "
            f"eval {r['eval_s']:.2f} s, train loss {r['final_train_loss']:.4f}, val loss {r['final_val_loss']:.4f}")
    if "final_val_accuracy" in r:
        line += f", test accuracy {r['final_val_accuracy']:.4f}"
    if "time_to_target_s" in r:
        t = r["time_to_target_s"]
        line += ", target not reached" if t is None else f", target reached at {t:.1f} s"
    if "forward_check" in r:
        line += f", forward check {r['forward_check']['max_rel_diff']:.1e}"
    if "compile_cache" in r:
        line += f", programs from the cache {_from_cache(r['compile_cache'])}"
    return line + f", peak RSS {r['peak_rss_mib']:.0f} MiB"


COLUMNS = ("workload", "variant", "runs", "ms/step", "min–max", "steps/s", "vs eager", "vs compile", "compile s",
           "eval s", "train loss", "val loss", "acc / to target", "RSS MiB", "MFU")  # medians over runs
RUN_COLUMNS = ("workload", "variant", "run", "train s", "ms/step", "compile s", "eval s", "train loss", "val loss",
               "acc / to target", "RSS MiB", "from cache", "forward Δ")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _row(row: dict[str, Any]) -> list[str]:
    if "final_val_accuracy" in row:
        outcome = _fmt(_median(row["final_val_accuracy"]), ".4f")
    else:
        reached = [t for t in row["time_to_target_s"] if t is not None]
        outcome = "not reached" if not reached else f"{statistics.median(reached):.1f} s"
        outcome += f" ({len(reached)}/{row['runs']})" if 0 < len(reached) < row["runs"] else ""
    return [
        row["workload"], row["variant"], str(row["runs"]), f"{row['median_ms_per_step']:.2f}",
        f"{row['min_ms_per_step']:.2f}–{row['max_ms_per_step']:.2f}", f"{row['steps_per_s']:.1f}",
        _fmt(row["vs_torch_eager"], ".2f") + ("x" if row["vs_torch_eager"] else ""),
        _fmt(row["vs_torch_compile"], ".2f") + ("x" if row["vs_torch_compile"] else ""),
        f"{row['median_compile_s']:.2f}", f"{row['median_eval_s']:.2f}",
        f"{statistics.median(row['final_train_loss']):.4f}", _fmt(_median(row["final_val_loss"]), ".4f"),
        outcome, f"{row['median_peak_rss_mib']:.0f}", f"{row['median_mfu']:.1%}",
    ]


def _run_row(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [r["workload"], r["variant"], str(r["run"]), "FAILED", *["-"] * (len(RUN_COLUMNS) - 4)]
    if "final_val_accuracy" in r:
        outcome = _fmt(r["final_val_accuracy"], ".4f")
    else:
        outcome = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s"
    check = r.get("forward_check")
    return [
        r["workload"], r["variant"], str(r["run"]), f"{r['train_s']:.2f}", f"{r['ms_per_step']:.2f}",
        f"{r['compile_s']:.2f}", f"{r['eval_s']:.2f}", f"{r['final_train_loss']:.4f}",
        _fmt(r["final_val_loss"], ".4f"), outcome, f"{r['peak_rss_mib']:.0f}", _from_cache(r.get("compile_cache")),
        "-" if check is None else f"{check['max_rel_diff']:.1e}" + ("" if check["passed"] else " FAIL"),
    ]


def _from_cache(cache: dict[str, Any] | None) -> str:
    """A jaxtrain run's programs loaded from the compilation cache, of those it compiled or loaded."""
    if cache is None:
        return "-"
    if cache["dir"] is None:
        return "off"
    return f"{cache['loaded']} of {cache['loaded'] + cache['written']}"


def cache_mode(config: FrameworksConfig) -> str:
    """How the children's compilation caches were set, for the report."""
    if config.cold:
        return ("compilation cache cold: every compiling child had a fresh, empty cache directory and compiled "
                "everything, as a user's first run does")
    return ("compilation cache: the user's (jaxtrain's JAXTRAIN_COMPILE_CACHE, torch.compile's Inductor cache), "
            "shared by the children: runs after the first load their programs from it (--cold for a first run)")


def _notes(runs: list[dict[str, Any]], rows: list[dict[str, Any]], skipped: dict[str, str], peak: float,
           config: FrameworksConfig) -> list[str]:
    notes = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        by = {r["variant"]: r for r in rows if r["workload"] == workload}
        if "jaxtrain" in by:
            against = (("vs_torch_eager", "PyTorch eager"), ("vs_torch_compile", "torch.compile"))
            parts = [f"{by['jaxtrain'][key]:.2f}x vs {name}" for key, name in against if by["jaxtrain"][key]]
            if parts:
                notes.append(f"{workload}: jaxtrain speedup (torch median ms/step / jaxtrain median) "
                             + ", ".join(parts))
            mine = by["jaxtrain"]["median_peak_rss_mib"]
            others = [(name, by[v]) for v, name in (("torch-eager", "PyTorch eager's"), ("torch-compile",
                      "torch.compile's"), (BASELINE, "the baseline's")) if v in by]
            if others:
                notes.append(f"{workload}: jaxtrain's median peak RSS is " + ", ".join(
                    f"{mine / row['median_peak_rss_mib']:.2f}x {name}" for name, row in others))
            if BASELINE in by:
                notes.append(f"{workload}: jaxtrain's median ms/step is "
                             f"{by['jaxtrain']['median_ms_per_step'] / by[BASELINE]['median_ms_per_step']:.3f}x "
                             f"the baseline's ({BASELINE}: jaxtrain from {config.baseline_src})")
    notes += [
        cache_mode(config) + "; 'from cache': a jaxtrain run's programs loaded from the cache, of all it compiled "
        "or loaded.",
        "first table: medians over runs; 'vs eager' and 'vs compile' are that variant's median ms/step divided by "
        "the row's (above 1: the row is faster); 'acc / to target': mnist-cnn test accuracy, char-gpt time to target.",
        "times exclude compilation and evaluation. jaxtrain: fit's train_time_s (compiled ahead of time). "
        "torch-eager: every step. torch-compile: step 1 compiles; its time minus the mean of steps 2..N is "
        "counted as compile time and training time is N × that mean; evaluation graphs are compiled before "
        "training on one batch of each evaluation shape (counted as compile time).",
        f"MFU: model FLOPs per step / time per step / {peak:.0f} GFLOP/s, this machine's float32 matmul rate "
        "(2048×2048 jitted JAX matmul, as the ladder measures it).",
        "all variants start from the JAX model's initial weights and train on fit's batches in fit's order with "
        "the same optimizer and per-step learning rate; 'forward Δ' is max |torch logit - JAX logit| / "
        "max |JAX logit| on those weights (tolerance 1e-4).",
        "train loss: mean over the last evaluation interval's steps (fit's epoch mean).",
    ]
    if "char-gpt" in {r["workload"] for r in rows}:
        notes.append(f"char-gpt 'to target': training + evaluation seconds (compile excluded) until the first "
                     f"validation estimate <= {config.target_val_loss}.")
    for v, why in skipped.items():
        notes.append(f"{v} skipped: {why}")
    for r in runs:
        if "error" in r:
            notes.append(f"{r['workload']} {r['variant']} run {r['run']} FAILED: {r['error']}")
        elif not r.get("forward_check", {"passed": True})["passed"]:
            notes.append(f"{r['workload']} {r['variant']} run {r['run']}: forward check FAILED "
                         f"({r['forward_check']['max_rel_diff']:.1e} > {r['forward_check']['tolerance']:g})")
    return notes


def _write(config: FrameworksConfig, machine: dict[str, Any], peak: float, info: dict[str, Any],
           runs: list[dict[str, Any]], rows: list[dict[str, Any]], notes: list[str], console: Any) -> None:
    """Prints the tables; writes results.json, results.md and frameworks.png under `config.out`."""
    from rich.table import Table

    out = Path(config.out)
    title = "jaxtrain vs PyTorch: time per training step (medians), compile and evaluation excluded"
    tables = []
    for columns, cells, name in ((COLUMNS, [_row(r) for r in rows], title),
                                 (RUN_COLUMNS, [_run_row(r) for r in runs], "every run")):
        table = Table(title=name)
        for column in columns:
            table.add_column(column, justify="left" if column in ("workload", "variant") else "right")
        for line in cells:
            table.add_row(*line)
        console.print(table)
        tables.append(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                      + ["| " + " | ".join(line) + " |" for line in cells])
    for note in notes:
        console.print(note)

    payload = {"config": dataclasses.asdict(config), "machine": machine, "peak_gflops": peak, "workloads": info,
               "summary": rows, "runs": runs, "notes": notes}
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    header = (f"# {title}\n\n{machine['jax_device']}, JAX {machine['jax_version']}, PyTorch "
              f"{machine['torch_version'] or 'not installed'} (CPU), {config.runs} run(s) per variant; "
              f"{cache_mode(config)}\n")
    md = [header, *tables[0], "", "## Every run", "", *tables[1], "", *[f"- {n}" for n in notes]]
    (out / "results.md").write_text("\n".join(md) + "\n")
    _chart(rows, out / "frameworks.png")
    console.print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'frameworks.png'}")


def _chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows)) or ["(nothing ran)"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    colors = {"jaxtrain": "#4c72b0", BASELINE: "#8c8c8c", "torch-eager": "#dd8452", "torch-compile": "#55a868"}
    for ax, workload in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == workload]
        medians = [r["median_ms_per_step"] for r in mine]
        errors = [[m - r["min_ms_per_step"] for m, r in zip(medians, mine)],
                  [r["max_ms_per_step"] - m for m, r in zip(medians, mine)]]
        bars = ax.bar([r["variant"] for r in mine], medians, yerr=errors, capsize=6,
                      color=[colors[r["variant"]] for r in mine])
        for bar, m, r in zip(bars, medians, mine):
            ax.text(bar.get_x() + bar.get_width() / 2, r["max_ms_per_step"], f"{m:.1f}", ha="center", va="bottom",
                    fontsize=9)
        ax.set_title(f"{workload}: median ms/step (min–max)")
        ax.set_ylabel("ms per training step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    child_main(lambda payload: jaxtrain_child(payload["workload"], payload["config"]))
