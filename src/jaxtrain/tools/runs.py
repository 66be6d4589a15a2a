"""Run directories: train a recipe into one, find the newest, reload its config and model."""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import optax
from flax import nnx
from rich.console import Console

from jaxtrain import ConfigError, FitResult, Hook, LambdaHook, distributed
from jaxtrain import data as data_lib
from jaxtrain.data import CharTokenizer
from jaxtrain.engine import (
    Forward,
    RunGuard,
    RunOptions,
    build_program,
    check_path_length,
    device_description,
    evaluate_state,
    from_dict,
    load_with_step,
    make_layout,
    read_config,
    release_compiled_programs,
    run,
    setting,
    to_dict,
    to_spec,
    write_text,
)
from jaxtrain.tools.recipes import RECIPES, Recipe, RecipeConfig, get_recipe
from jaxtrain.tools.recipes.base import Workload

MODEL_INFO = "model.json"  # the workload's `info`: what rebuilds the model without reading data
PREDICT_INFO = "predict.json"  # what prediction feeds the model: its input field, shape, preprocessing


_first_run = True  # of this process (`train`)


def train(recipe: Recipe, config: RecipeConfig, run_dir: str | os.PathLike | None = None, resume: bool = False,
          console: Console | None = None, overwrite: bool = False, hooks: Sequence[Hook] = (),
          plots: bool = True, started: float | None = None) -> FitResult:
    """Builds `recipe`'s workload for `config` and fits it into `run_dir` (a new timestamped
    directory under runs/ by default); the data sources it opened are closed afterwards. `resume`
    and `overwrite` are `fit`'s; `hooks` join the recipe's (a sweep's pruning); `plots=False`
    leaves curves.png to `jaxtrain plot`; a deadline (`--max-time`) counts from `started`
    (`time.perf_counter()`; `process_start()` for a command's one run), else from this call.

    The first run of a process drops the programs compiled while building its workload (a model
    initialised eagerly compiles one per op: char-gpt's, about 50 MiB kept through the run
    otherwise); a later run of the process (a sweep's next trial) keeps them, since it builds the
    same and would compile or load them again (0.3 s of each mlp-regression trial)."""
    global _first_run
    started = time.perf_counter() if started is None else started  # a deadline counts the workload's build
    if distributed.initialize(config.dist) > 1 and not (run_dir or config.run_dir):
        raise ConfigError("a job of several processes needs one run directory on a filesystem they share; "
                          "pass --run-dir DIR")
    run_dir = Path(run_dir or config.run_dir or f"runs/{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    check_path_length(run_dir, "run_dir")  # before the guard makes anything
    with RunGuard(run_dir, {"recipe": recipe.name, **to_dict(config)}, resume=resume, overwrite=overwrite,
                  primary=jax.process_index() == 0, create=False, note=lambda text: None):
        pass  # refuse a directory in use or holding a run before the workload is built (fit claims it)
    if config.checkpoint.enabled:
        _import_in_background("orbax.checkpoint")
    w = recipe.build(config)
    if _first_run:  # the model's eager initialisers compiled an op each: not kept through the run
        release_compiled_programs()
        _first_run = False
    try:
        if config.val_split and w.val is not None:  # the recipe's own held-out rows: one validation set or the other
            own = (f"; pass {setting('data.val_samples', 0)} with it" if hasattr(getattr(config, "data", None),
                                                                             "val_samples") else ": drop it")
            raise ConfigError(f"{setting('val_split', config.val_split)} holds out the last training rows for "
                              f"validation, but {recipe.name} validates on rows of its own{own}")
        verbosity = "result" if config.quiet and config.verbosity == "progress" else config.verbosity
        return run(w.model, w.loss_fn, w.train, w.val, config,
                   hooks=[_save_info(recipe, w, run_dir), *w.hooks, *hooks], preprocess=w.preprocess,
                   augment=w.augment, run_dir=run_dir,
                   resume="overwrite" if overwrite else resume, verbosity=verbosity,
                   session=RunOptions(name=recipe.name, saved_config=config, console=console, plots=plots,
                                      started=started))
    finally:
        w.close()


def process_start() -> float:
    """`time.perf_counter()` when this process started (Linux: /proc), else now: the first run of a
    `jaxtrain` command counts its imports into a deadline, as a wall clock around the command does."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the command's name
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 3600 else now


def train_population(recipe: Recipe, configs: Sequence[RecipeConfig], run_dirs: Sequence[str | os.PathLike],
                     hooks: Sequence[Sequence[Hook]] = (), console: Console | None = None,
                     adapt: Callable[..., Any] | None = None, resume: bool = False,
                     joined: Sequence[int] = (), parents: Sequence[int | None] = ()) -> list[FitResult]:
    """Trains one run of `recipe` per config, side by side as one population
    (`jaxtrain.fit_population`), each into its run directory; the workload (data, loss,
    preprocessing) is built once, from the first config, and each member's model from its own.
    The configs may differ only where members of a population may (their optimizer settings, ...);
    `hooks[i]` join member i's. Returns a `FitResult` per member, in order.

    `adapt(epoch, slots, member_of)`: an adaptive population (`fit_population`'s `adapt`, with
    `member_of(config, run_dir, hooks)` making a new run's `Member` of the recipe); the results
    then hold the refills' runs after the members'. `resume`: continue the population in these run
    directories (`fit_population`'s); `joined[i]` and `parents[i]`: when member i took its slot
    and whose weights it took (`Member.joined` and `parent`; default 0 and None each).

    Raises:
      ConfigError: a recipe whose runs carry hooks of their own (self-play), or configs that cannot
        share a population.
    """
    from jaxtrain import Member, fit_population

    hooks = list(hooks) or [()] * len(configs)
    joined, parents = list(joined) or [0] * len(configs), list(parents) or [None] * len(configs)
    if any(len(x) != len(configs) for x in (hooks, run_dirs, joined, parents)):
        raise ConfigError("train_population needs one run directory, list of hooks, joined epoch and parent per "
                          "config")
    for run_dir in run_dirs:
        check_path_length(Path(run_dir), "run_dir")
    w = recipe.build(configs[0])
    if w.hooks:
        w.close()
        names = ", ".join(type(h).__name__ for h in w.hooks)
        raise ConfigError(f"{recipe.name}'s runs carry hooks of their own ({names}); train its trials one at a time")
    try:
        same = population_key(configs[0])  # members that differ only in per-member settings share an init
        models = [w.model] + [nnx.clone(w.model) if population_key(c) == same else recipe.model(c, w.info)
                              for c in configs[1:]]
        members = [Member(model, c, Path(d), hooks=[_save_info(recipe, w, Path(d)), *h], name=recipe.name,
                          saved_config=c, joined=j, parent=p)
                   for model, c, d, h, j, p in zip(models, configs, run_dirs, hooks, joined, parents)]

        def member_of(config: RecipeConfig, run_dir: str | os.PathLike, more: Sequence[Hook]) -> Member:
            """A run that takes a slot: its weights come from the slot (its model a copy to fill)."""
            return Member(nnx.clone(w.model), config, Path(run_dir), hooks=[_save_info(recipe, w, Path(run_dir)),
                                                                            *more],
                          name=recipe.name, saved_config=config)

        scheduler = None if adapt is None else (lambda epoch, slots: adapt(epoch, slots, member_of))
        return fit_population(members, w.loss_fn, w.train, w.val, preprocess=w.preprocess, augment=w.augment,
                              verbosity="silent" if console is None else "summary", console=console,
                              adapt=scheduler, resume=resume)
    finally:
        w.close()


def _save_info(recipe: Recipe, w: Workload, run_dir: Path) -> Hook:
    """A hook that writes the run's model.json and predict.json when it starts (process 0 only)."""

    def save(run: Any) -> None:
        if jax.process_index() != 0:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / MODEL_INFO, json.dumps({"recipe": recipe.name, **w.info}, indent=2) + "\n")
        if w.inputs is not None:
            write_text(run_dir / PREDICT_INFO, json.dumps(predict_info(w), indent=2) + "\n")

    return LambdaHook(on_start=save)


def population_key(config: RecipeConfig) -> str:
    """What runs of a recipe trained as one population share: every setting but those a member may
    set its own way (`PER_MEMBER`: the optimizer's, checkpoints, logging) and where its files go and
    what it prints. Configs with equal keys share a population (and, the seed among them, an init)."""
    from jaxtrain.engine import PER_MEMBER

    values = to_dict(config)
    for name in (*PER_MEMBER, "run_dir", "quiet", "verbosity", "dist"):
        values.pop(name, None)
    return json.dumps(values, sort_keys=True, default=str)


def predict_info(w: Workload) -> dict[str, Any]:
    """What `predict` and `export` need to feed a run's model raw inputs, without its data: the
    input field, one raw input's shape and dtype, and the preprocessing (its statistics included;
    None when the raw inputs go to the model as they are)."""
    assert w.inputs is not None  # asked only of workloads whose model has an input field
    preprocess = w.preprocess if w.predict_preprocess else None
    spec = to_spec(preprocess)
    if preprocess is not None and spec is None:
        raise ConfigError(f"the model's preprocessing ({type(preprocess).__name__}) cannot be saved with the run; "
                          "build it from jaxtrain.data.normalize, standardize_images and compose")
    if w.input_sample is not None:
        shape, dtype = w.input_sample
    else:
        first = w.train.read(0, 1) if data_lib.is_source(w.train) else {k: v[:1] for k, v in w.train.items()}
        shape, dtype = first[w.inputs].shape[1:], str(first[w.inputs].dtype)
    return {"inputs": w.inputs, "shape": list(shape), "dtype": dtype, "preprocess": spec}


def _import_in_background(module: str) -> None:
    """Imports `module` in a daemon thread while the main thread builds the workload (NumPy and
    XLA's compiler leave the other core and the GIL free much of that time): Orbax takes ~0.2 s
    to import, and fit needs it only once the workload is built."""

    def load() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the import where it is needed reports the problem
            pass

    threading.Thread(target=load, name=f"jaxtrain-import-{module}", daemon=True).start()


def latest_run(recipe: str, root: str | os.PathLike = "runs") -> Path:
    """The most recently modified directory under `root` whose config.json is a run of `recipe`,
    whatever its name (`--run-dir runs/wide` as well as the default `runs/<recipe>-<time>`)."""

    def of_recipe(path: Path) -> bool:
        try:
            return read_config(path).get("recipe") == recipe
        except (ConfigError, OSError, AttributeError):  # not a run, or not one this can read
            return False

    runs = [p for p in Path(root).glob("*") if of_recipe(p)]
    if not runs:
        raise ConfigError(f"no run of {recipe} under {root}/ to resume; pass the run directory: --resume RUN_DIR")
    return max(runs, key=lambda p: p.stat().st_mtime)


def load_config(run_dir: str | os.PathLike, recipe: str | None = None) -> tuple[Recipe, RecipeConfig]:
    """The recipe and config a run directory was trained with.

    Raises:
      ConfigError: missing directory or config.json, another recipe than `recipe`, unknown keys.
    """
    values = read_config(Path(run_dir))
    saved = values.pop("recipe", None)
    if recipe is not None and saved != recipe:
        raise ConfigError(f"{run_dir} is a run of recipe {saved!r}, not {recipe!r}")
    if saved not in RECIPES:
        raise ConfigError(f"{run_dir} was written by jaxtrain.fit from Python (run {saved!r}), not by a recipe; "
                          "load it with jaxtrain.load(run_dir, model=template), the template a model of the same "
                          "structure")
    found = get_recipe(saved)
    return found, from_dict(type(found.config), values)


def _model_info(run_dir: Path, recipe: Recipe, config: RecipeConfig) -> dict[str, Any]:
    """The run's model.json; a run written before it existed rebuilds the workload once to learn it."""
    path = run_dir / MODEL_INFO
    if path.is_file():
        info = json.loads(path.read_text())
        info.pop("recipe", None)
        return info
    workload = recipe.build(config)
    workload.close()
    return workload.info


def restore_model(run_dir: str | os.PathLike, checkpoint: str = "best", model: nnx.Module | None = None,
                  weights: str = "raw") -> tuple[nnx.Module, int]:
    """A run's model with the weights of checkpoint `checkpoint` (best, latest or a step).

    The model comes from `model` (a template of the same structure) or, for runs of a recipe,
    from the recipe and the run's config.json and model.json; no training data are read and no
    optimizer is rebuilt: only the model's variables are restored.

    Returns:
      `(model, step)`.
    """
    run_dir = Path(run_dir)
    if model is None:
        recipe, recipe_config = load_config(run_dir)
        model = recipe.model(recipe_config, _model_info(run_dir, recipe, recipe_config))
    return load_with_step(run_dir, model, checkpoint, weights)


def load(run_dir: str | os.PathLike, checkpoint: str = "best", model: nnx.Module | None = None,
         weights: str = "raw") -> nnx.Module:
    """The trained model of a run directory, for prediction in Python (`jaxtrain.load`, which
    also builds the model of a recipe run from its config).

    Args:
      run_dir: a directory written by `jaxtrain train` or by `jaxtrain.fit(..., run_dir=...)`.
      checkpoint: `best` (by the run's best metric), `latest`, or a step number.
      model: for runs written from Python, a model of the same structure to fill, e.g.
        `nnx.eval_shape(lambda: MyModel(..., rngs=nnx.Rngs(0)))` (no memory is spent on its
        initial weights); recipe runs need none.

    The model alone: a recipe run's preprocessing (its inputs' normalisation) is not inside it.
    Predict with both: `jaxtrain.predict(model, x, preprocess=runs.preprocess_of(run_dir))`.

    Example:
      >>> model = jaxtrain.load("runs/mine", model=nnx.eval_shape(lambda: MLP((8, 16, 3), rngs=nnx.Rngs(0))))
    """
    return restore_model(run_dir, checkpoint, model, weights)[0]


def preprocess_of(run_dir: str | os.PathLike) -> Any:
    """The preprocessing a recipe run trained with (from its predict.json), for `jaxtrain.predict`'s
    `preprocess`; None when the run's model takes its raw inputs as they are.

    Raises:
      ConfigError: the run has no predict.json (see `read_predict_info`).

    Example:
      >>> y = jaxtrain.predict(runs.load("runs/mlp"), x_raw, preprocess=runs.preprocess_of("runs/mlp"))
    """
    return _preprocess(read_predict_info(run_dir))


def _preprocess(info: dict[str, Any]) -> Any:
    """The preprocessing a run's predict.json (`info`) describes, or None."""
    from jaxtrain.engine import from_spec

    return from_spec(info["preprocess"]) if info.get("preprocess") else None


def evaluate(run_dir: str | os.PathLike, checkpoint: str = "best") -> dict[str, Any]:
    """Validation metrics of checkpoint `checkpoint` of a recipe run, computed like `fit` does.

    The workload is built for its validation data and preprocessing (whose statistics can come
    from the training data); the sources it opens are closed.
    """
    recipe, config = load_config(run_dir)
    model, step = restore_model(run_dir, checkpoint)
    workload = recipe.build(config)
    try:
        if workload.val is None:
            raise ConfigError(f"recipe {recipe.name} with this config has no validation data to evaluate on")
        val = workload.val.read(0, len(workload.val)) if data_lib.is_source(workload.val) else workload.val
    finally:
        workload.close()
    n = data_lib.num_samples(val)
    program = build_program(model, workload.loss_fn, config, optimizer=optax.identity(),
                            preprocess=workload.preprocess, total_steps=1, layout=make_layout("data=1"))
    metrics = evaluate_state(program.eval_step, program.state, jax.tree.map(jax.numpy.asarray, val),
                             config.eval_batch_size or config.batch_size)  # jaxtrain.evaluate's pass
    return {"recipe": recipe.name, "step": step, "samples": n, "device": device_description(jax.devices()[0]),
            **{f"val_{k}": v for k, v in metrics.items()}}


def sample_text(
    run_dir: str | os.PathLike,
    prompt: str = "\n",
    length: int = 500,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    checkpoint: str = "best",
) -> str:
    """Text generated by a trained text model (`char-gpt`): `prompt` followed by `length` sampled
    characters; the same seed gives the same text."""
    from jaxtrain.engine import sample_gpt
    from jaxtrain.models import GPT

    if not prompt:
        raise ConfigError("the prompt is empty; pass at least one character, e.g. --prompt $'\\n'")
    if length < 1:
        raise ConfigError(f"length={length} must be >= 1")
    recipe, config = load_config(run_dir)
    vocabulary = _model_info(Path(run_dir), recipe, config).get("vocabulary")
    if vocabulary is None:
        raise ConfigError(f"{run_dir} is a run of {recipe.name}, which does not generate text; use a char-gpt run")
    model, _ = restore_model(run_dir, checkpoint)
    assert isinstance(model, GPT)  # char-gpt's, as its vocabulary says
    tokenizer = CharTokenizer(vocabulary)
    out = sample_gpt(model, jax.numpy.asarray(tokenizer.encode(prompt)), length, jax.random.key(seed), temperature,
                     top_k)
    return tokenizer.decode(jax.device_get(out))


def read_predict_info(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A recipe run's predict.json (see `predict_info`).

    Raises:
      ConfigError: the run has none (a run trained from Python, a model with no forward on one
        input, as AlphaZero's network, or a run trained before jaxtrain saved one), or it is not a
        JSON object (truncated, emptied, edited).
    """
    path = Path(run_dir) / PREDICT_INFO
    if not path.is_file():
        recipe = read_config(Path(run_dir)).get("recipe")  # not a run directory at all: that line first
        if recipe not in RECIPES:
            raise ConfigError(f"{run_dir} was trained from Python with jaxtrain.fit (run {recipe!r}), so it has no "
                              f"{PREDICT_INFO}; predict it from Python: jaxtrain.predict(jaxtrain.load(run_dir, "
                              "model=template), inputs, preprocess=...), the template a model of the run's structure")
        raise ConfigError(f"{run_dir} has no {PREDICT_INFO}: its model takes no single input to predict from, or "
                          "the run was trained before jaxtrain saved what prediction needs; train it again")
    try:
        info = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise ConfigError(f"{path} cannot be read ({str(e)[:120]}); it is truncated or damaged: train the run again, "
                          "or restore the file") from None
    if not isinstance(info, dict) or not {"inputs", "shape", "dtype"} <= info.keys():
        raise ConfigError(f"{path} is not what a run saves for prediction (a JSON object with inputs, shape and "
                          "dtype); it is damaged or edited: train the run again, or restore the file")
    return info


def _saved_model(run_dir: str | os.PathLike, checkpoint: str, weights: str) -> tuple[Any, ...]:
    """`(recipe, config, model, preprocess, info, step)` of a recipe run, for prediction and export."""
    info = read_predict_info(run_dir)
    recipe, config = load_config(run_dir)
    model, step = restore_model(run_dir, checkpoint, weights=weights)
    return recipe, config, model, _preprocess(info), info, step


def run_forward(run_dir: str | os.PathLike, checkpoint: str = "best", weights: str = "raw"
                ) -> tuple[Forward, dict[str, Any], int]:
    """`(forward, info, step)`: the evaluation-mode forward of a recipe run's checkpoint (its raw
    weights or their average) with the run's saved preprocessing, on the run's mesh; `info` is its
    predict.json."""
    _, config, model, preprocess, info, step = _saved_model(run_dir, checkpoint, weights)
    return Forward(model, preprocess, info["inputs"], make_layout(config.mesh)), info, step


def predict_files(run_dir: str | os.PathLike, input_path: str | os.PathLike, output_path: str | os.PathLike,
                  batch_size: int | None = None, checkpoint: str = "best", weights: str = "raw",
                  allow_nonfinite: bool = False) -> str:
    """`jaxtrain predict`: the outputs of a recipe run's checkpoint for the raw inputs in
    `input_path`, written to `output_path` batch by batch (whole or not at all, never over the
    inputs); returns a one-line account. Input rows with NaN or Inf are refused unless
    `allow_nonfinite`."""
    from jaxtrain.engine import predict_batches
    from jaxtrain.tools.array_files import check_output, close_inputs, read_inputs, write_outputs

    check_output(output_path, [input_path])  # before any work: a bad output or input costs nothing
    info = read_predict_info(run_dir)
    data = read_inputs(input_path, info["inputs"], tuple(info["shape"]), info["dtype"])
    try:
        forward, info, step = run_forward(run_dir, checkpoint, weights)
        n = data_lib.num_rows(data)
        t0 = time.perf_counter()
        shapes = write_outputs(output_path, predict_batches(forward, data, batch_size=batch_size,
                                                            allow_nonfinite=allow_nonfinite), n, [input_path])
        seconds = time.perf_counter() - t0
    finally:
        close_inputs(data)
    outputs = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
    return (f"{output_path}: {outputs} from {n:,} rows of {input_path} (checkpoint of step {step:,}"
            f"{', the average of its weights' if weights == 'ema' else ''}, "
            f"{n / max(seconds, 1e-9):,.0f} rows/s)")


def export_run(run_dir: str | os.PathLike, out: str | os.PathLike, checkpoint: str = "best",
               platforms: tuple[str, ...] = (), weights: str = "raw") -> str:
    """`jaxtrain export`: a recipe run's checkpoint as a self-contained artifact in `out` (see
    `jaxtrain.export`), its saved preprocessing folded in; returns a one-line account."""
    from jaxtrain import export
    from jaxtrain.engine import check_export_directory, check_export_platforms

    platforms, _ = check_export_platforms(platforms), check_export_directory(Path(out))  # before the model is restored
    recipe, _, model, preprocess, info, step = _saved_model(run_dir, checkpoint, weights)
    example = jax.ShapeDtypeStruct((1, *info["shape"]), info["dtype"])
    signature = export(model, example, out, preprocess=preprocess, inputs=info["inputs"], platforms=platforms,
                       metadata={"recipe": recipe.name, "run_dir": str(run_dir), "step": step, "weights": weights})
    outputs = ", ".join(f"{o['name']} ({', '.join(map(str, o['shape']))}) {o['dtype']}" for o in signature["outputs"])
    return (f"{out}: model.jax_export (raw {info['inputs']} ({', '.join(map(str, ['batch', *info['shape']]))}) "
            f"{info['dtype']} -> {outputs}), signature.json, weights.safetensors, README.md; checkpoint of step "
            f"{step:,}, for {', '.join(signature['platforms'])}")


def summarize(recipe: Recipe, config: RecipeConfig) -> dict[str, Any]:
    """`jaxtrain summary RECIPE`: the model summary of the recipe's workload with every module, and
    the FLOPs of one compiled training step (XLA's cost analysis); nothing is trained."""
    from jaxtrain.engine import abstract_batch, model_summary

    w = recipe.build(config)
    try:
        batch = abstract_batch(w.train, config.batch_size * config.grad_accum, "train_data")

        def trace(model: nnx.Module, batch: Any) -> Any:
            return w.loss_fn(model, w.preprocess(batch) if w.preprocess else batch, jax.random.key(0))

        summary = model_summary(w.model, trace, batch)
        program = build_program(w.model, w.loss_fn, config, preprocess=w.preprocess, augment=w.augment,
                                total_steps=1, layout=make_layout("data=1"))
        cost = program.compile_step(batch).cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        flops = float(cost["flops"]) if cost and cost.get("flops", -1) > 0 else None
        if flops is not None and config.grad_accum > 1:
            from jaxtrain.engine import loop_body_counted_once
            flops *= config.grad_accum if loop_body_counted_once() else 1
    finally:
        w.close()
    return {**summary, "flops_per_step": flops, "batch_size": config.batch_size}
