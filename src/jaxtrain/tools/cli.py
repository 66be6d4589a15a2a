"""The `jaxtrain` command. It parses arguments, builds a config and calls the library."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import logging
import os
import re
import shlex
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Literal, Sequence

from jaxtrain import ConfigError, JaxtrainError, __version__
from jaxtrain.engine import remove_partials, rendering

USAGE = """usage: jaxtrain COMMAND ...

commands:
  train RECIPE [--preset NAME] [OPTIONS]
                           train a recipe; `jaxtrain train RECIPE --help` lists every option
  train RECIPE --resume [RUN_DIR] [OPTIONS]
                           continue a run from its newest checkpoint (default: the newest run);
                           a run with no checkpoint yet starts from the beginning
  train RECIPE --run-dir DIR --overwrite [OPTIONS]
                           start again in a directory that holds a run (its files are replaced)
  eval RUN_DIR [--checkpoint best|latest|STEP]
                           evaluate a run's checkpoint on its validation data
  predict RUN_DIR --input FILE --output FILE [--batch-size N] [--checkpoint best|latest|STEP]
          [--weights raw|ema] [--allow-nonfinite]
                           a trained run's outputs for raw inputs (.npy, .npz, HDF5), with the run's own
                           preprocessing, in batches: one compiled forward, bounded memory
  export RUN_DIR --out DIR [--checkpoint best|latest|STEP] [--platforms cpu,cuda] [--weights raw|ema]
                           the trained model as an artifact that runs with JAX alone: StableHLO with the
                           weights inside and the preprocessing folded in (raw inputs, any batch size),
                           signature.json, weights.safetensors, and a README saying how to call it
  plot RUN_DIR [--out FILE.png]
                           draw a run's loss curves (default RUN_DIR/curves.png)
  compare RUN_DIR... [--out FILE.png]
                           runs side by side: the config keys that differ, their results, and their
                           loss curves overlaid in one PNG (default runs/compare.png)
  doctor [--json] [--expect-device cpu|gpu|tpu] [--expect-devices N] [--quick]
                           check the setup in seconds: versions, devices, jit, transfer, dispatch,
                           matmul rate, XLA options (cuDNN attention, bf16 on a GPU); exit 1 if one fails
  scan PATH... [--format text|json] [--fail-on high|medium|low|never]
                           static analysis of your JAX training code for what makes it slow
                           (un-jitted steps, per-step copies and syncs, ...); `jaxtrain scan --help` lists the rules
  profile RECIPE [--preset NAME] [OPTIONS] [--seconds S] [--trace DIR]
                           train one epoch or S seconds (default 20) and show where the time goes: input,
                           copies, compute, dispatch, host sync, compilation, FLOP/s; a verdict and what to change
  sample RUN_DIR [--prompt TEXT] [--length N] [--temperature T] [--top-k K] [--seed S]
                           generate text from a trained char-gpt run
  summary RECIPE [--preset NAME] [--json] [OPTIONS]
                           the model: each module's path, type, output shape, parameters and bytes; the
                           totals; FLOPs of one compiled training step
  recipes                  list the recipes
  --version                print jaxtrain's version
  tune batch-size RECIPE [--preset NAME] [--max-memory-gb G] [--max-batch N] [--seconds S] [--no-throughput]
                    [--check-samples N] [--out FILE.png] [OPTIONS]
                           the largest batch whose training step fits a memory cap (default: the device's memory),
                           samples/s at each power of two up to it, and the fastest batch and learning rate that
                           train as well as the config's in short runs of each
  sweep RECIPE [TRAIN FLAGS] --space NAME=KIND:ARGS ... --trials N --out DIR [--storage URL] [--study NAME]
                           a hyperparameter search on Optuna: a run directory per trial, pruning, a study
                           that re-running continues; `sweep report DIR` tables and plots it
  tune lr RECIPE [--min-lr A] [--max-lr B] [--steps N] [--check-samples N] [--out FILE.png] [OPTIONS]
                           the learning-rate range test: the loss while the rate grows exponentially, and a
                           suggested rate, recommended where a short run at it trains as well as the config's
  bench ladder [OPTIONS]   the optimization ladder: original loop → jaxtrain, PyTorch
  bench overhead [OPTIONS] jaxtrain.fit against a hand-written jit + lax.scan loop
  bench shortrun [OPTIONS] short runs (a classifier, a zoo conv model): fit's whole process vs a hand loop
  bench sameseed [OPTIONS] runs of one script and seed on a loaded machine: do they end bit-identical?
  bench progress [OPTIONS] make demo's run: its first progress reading against the run's throughput
  bench checkpoint [OPTIONS]  what checkpoints cost; kill-and-resume exactness
  bench ema [OPTIONS]      what an average of the weights (--ema) costs per training step
  bench faults [OPTIONS]  SIGKILL at each moment of a run x resume: do resumed runs equal an uninterrupted one
  bench frameworks [OPTIONS]  mnist-cnn and char-gpt: jaxtrain vs PyTorch eager / torch.compile
  bench gpu [--tiny] [--out DIR]  the GPU proof on one H100/H200 in ~9 min (benchmarks/gpu.sh): one JSON, one table
  bench profile --workload char-gpt|mnist-cnn|mlp-regression [--steps N] [--top N] [--out DIR]
                           per-op profile of one training step (jax.profiler trace vs torch.profiler), by op family
  bench data [OPTIONS]     HDF5 streaming vs device-resident throughput, memory, generation
  bench scan [OPTIONS]     a training step jitted alone vs inside lax.scan (XLA:CPU convolutions)
  bench scale [OPTIONS]    data parallel vs FSDP on 1, 2, 4 virtual devices: memory, collectives, agreement
  bench remat [OPTIONS]    --remat none / blocks / full: compiled memory and ms per training step
  bench attention [OPTIONS]  causal attention paths, forward + backward at T = 64, 256, 1024
  bench precision [OPTIONS]   fp32 / bf16 / fp16 and gradient accumulation: time and compiled memory per step
  bench predict [OPTIONS]  jaxtrain.predict against a hand-written jax.jit forward over the same batches
  bench preprocess [OPTIONS]  dataset loading with the preprocessing cache off, cold and warm
  bench sweep [OPTIONS]    trials per hour of `jaxtrain sweep` (one at a time, workers, populations);
                           tune lr's suggestion against the best rate a sweep finds
  bench selfplay [OPTIONS]  AlphaZero self-play: plain Python MCTS vs jitted network vs batched mctx; training updates/s
  bench xla-flags [OPTIONS]  XLA:CPU options (XNNPACK/YNNPACK, oneDNN, threads, scheduler, ISA, fast math) vs none
  bench scan-corpus [--corpus FILE] [--cache DIR]  jaxtrain scan's recall and precision on labelled public scripts
  bench zoo [--models A,B] [OPTIONS]  12 models written elsewhere: fit's defaults vs each source's own loop
  data generate WORKLOAD OUT.h5 --samples N [OPTIONS]   write a synthetic HDF5 dataset (mlp-regression, sequence;
                                                       --format npy: a folder of .npy shards)
  data inspect FILE [--rows N] [--json]                 an HDF5 file's datasets, attributes and sample statistics

examples:
  jaxtrain train mlp-regression
  jaxtrain train mlp-regression --epochs 3 --batch-size 256 --optim.lr 3e-4 --quiet
"""


# use the compile cache
COMPILING = ("train", "eval", "predict", "export", "summary", "sample", "profile", "tune", "sweep")


def parse_config(cls: type, default: Any, args: Sequence[str], prog: str, description: str | None = None) -> Any:
    """Parses `args` into `cls` (starting from `default`) with tyro.

    Parse errors become a one-line ConfigError instead of tyro's multi-line panel; `--help`
    prints tyro's help (headed by `description` when given, else by `cls`'s docstring) and exits 0.
    """
    import tyro

    if "-h" in args or "--help" in args:
        return tyro.cli(cls, default=default, args=list(args), prog=prog, description=description)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            return tyro.cli(cls, default=default, args=list(args), prog=prog)
    except SystemExit as e:
        if e.code == 0:
            raise
        raise ConfigError(f"{_panel_message(captured.getvalue())}; see `{prog} --help`") from None


def _panel_message(text: str) -> str:
    """The message section of a tyro error panel (between its first two rules), as one line."""
    sections: list[list[str]] = [[]]
    for line in text.splitlines():
        body = line.strip().strip("│╭╮╰╯").strip()
        if body and set(body) <= set("-─"):
            sections.append([])
        elif body:
            sections[-1].append(body)
    parts = sections[1] if len(sections) > 1 and sections[1] else sections[0]
    message = " ".join(parts).rstrip(".") or "invalid arguments"
    # tyro's suggestions for a mistyped flag, as flags alone: `--epoch 1` -> "did you mean --epochs?"
    guesses = [m.group(1) for part in sections[2:] if part[:1] == ["Perhaps you meant:"]
               for line in part[1:] if (m := re.match(r"(--[\w.-]+)", line))]
    if guesses:
        message += f" (did you mean {' or '.join(dict.fromkeys(guesses[:3]))}?)"
    return re.sub(r"^Error parsing [\w.]+: ", "", message)  # our own ConfigError, wrapped by tyro


def _pop_option(args: list[str], flag: str) -> tuple[bool, str | None]:
    """Removes `flag [VALUE]` from `args`: (present, VALUE or None)."""
    if flag not in args:
        return False, None
    i = args.index(flag)
    value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else None
    del args[i : i + (2 if value is not None else 1)]
    return True, value


def _aliased(recipe: Any, args: Sequence[str]) -> list[str]:
    """`args` with the recipe's other spellings of flags (`--training-batch-size 256`) replaced."""
    out = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        out.append(recipe.aliases.get(flag, flag) + eq + value if flag in recipe.aliases else arg)
    return out


def _preset_config(recipe: Any, rest: list[str], prog: str, flags: Sequence[str] = ()) -> tuple[Any, str | None]:
    """`(config, preset)`: the recipe's config from `--preset NAME` (taken out of `rest`; None when
    absent) and the other flags in `rest`. `flags`: the help's lines for the command's other flags
    that are not config fields."""
    has_preset, preset = _pop_option(rest, "--preset")
    if has_preset and preset not in recipe.presets:
        known = ", ".join(recipe.presets) if recipe.presets else "none"
        raise ConfigError(f"unknown preset {preset!r} for {recipe.name}; presets: {known}")
    default = recipe.presets[preset] if has_preset else recipe.config
    return parse_config(type(recipe.config), default, rest, prog, _recipe_help(recipe, flags)), preset


def _recipe_help(recipe: Any, flags: Sequence[str]) -> str | None:
    """The head of a recipe command's `--help`: the recipe's docstring, then the command's flags that
    tyro cannot list (they are not fields of the config), `--preset` first where the recipe has presets.
    None (tyro's own head, the docstring) when there are none."""
    import inspect

    presets = [f"  --preset NAME        start from one of the recipe's presets ({', '.join(recipe.presets)})"]
    lines = [*(presets if recipe.presets else []), *flags]
    if not lines:
        return None
    return f"{inspect.getdoc(type(recipe.config)) or recipe.name}\n\nbesides the options below:\n" + "\n".join(lines)


# `jaxtrain train RECIPE --help`: the flags `_train` takes out before the config is parsed.
TRAIN_FLAGS = ("  --resume [RUN_DIR]   continue a run from its newest checkpoint (default: the recipe's newest run)",
               "  --overwrite          with --run-dir DIR: start again in a directory that holds a run")


def _option_value(args: Sequence[str], flag: str) -> str | None:
    """The value given to `flag` (as `FLAG VALUE` or `FLAG=VALUE`), or None."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def _train(args: Sequence[str]) -> int:
    from jaxtrain.tools.recipes import get_recipe

    if not args or args[0].startswith("-"):
        raise ConfigError("missing recipe; usage: jaxtrain train RECIPE [OPTIONS] (see `jaxtrain recipes`)")
    recipe = get_recipe(args[0])
    rest = _aliased(recipe, args[1:])
    resume, run_dir = _pop_option(rest, "--resume")
    overwrite = "--overwrite" in rest
    rest = [a for a in rest if a != "--overwrite"]
    has_preset = "--preset" in rest
    prog = f"jaxtrain train {recipe.name}"
    if resume:
        from jaxtrain.tools import runs

        if has_preset:
            raise ConfigError("--preset cannot be combined with --resume: a resumed run keeps its own config")
        other = _option_value(rest, "--run-dir")
        if run_dir and other is not None and Path(other).resolve() != Path(run_dir).resolve():
            raise ConfigError(f"--resume {run_dir} and --run-dir {other} name two directories; a resumed run "
                              "stays where it is: give only --resume RUN_DIR")
        run_dir = run_dir or str(runs.latest_run(recipe.name))
        if (Path(run_dir) / "config.json").is_file():
            _, saved = runs.load_config(run_dir, recipe.name)
            saved = dataclasses.replace(saved, mesh="auto", dist=type(saved.dist)())  # where it runs is not the run
            # This command's --quiet, not the --verbosity kept from the run, says how much it prints.
            if "--quiet" in rest and _option_value(rest, "--verbosity") is None:
                saved = dataclasses.replace(saved, verbosity=recipe.config.verbosity)
            config = parse_config(type(recipe.config), saved, rest, prog)
        else:  # killed before it wrote its config: the command's settings start it from the beginning
            config = parse_config(type(recipe.config), recipe.config, rest, prog)
    else:
        config, _ = _preset_config(recipe, rest, prog, TRAIN_FLAGS)  # --help prints here, before JAX is imported
    from jaxtrain.tools import runs

    runs.train(recipe, config, run_dir or config.run_dir, resume=resume, overwrite=overwrite,
               started=runs.process_start())  # a deadline counts the command's whole time
    return 0


def _eval(args: Sequence[str]) -> int:
    import json

    from jaxtrain.tools import runs

    rest = list(args)
    _, checkpoint = _pop_option(rest, "--checkpoint")
    if len(rest) != 1 or rest[0].startswith("-"):
        raise ConfigError("usage: jaxtrain eval RUN_DIR [--checkpoint best|latest|STEP]")
    print(json.dumps(runs.evaluate(rest[0], checkpoint or "best"), indent=2))
    return 0


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """jaxtrain sample RUN_DIR: generate text from a trained char-gpt run."""

    prompt: str = "\n"
    """Text the sample continues (every character must be in the training vocabulary)."""
    length: int = 500
    """Characters to generate."""
    temperature: float = 0.8
    """Softmax temperature (> 0): lower is more conservative."""
    top_k: int = 200
    """Sample only among the k most likely characters (0: all)."""
    seed: int = 0
    """Sampling seed: the same seed gives the same text."""
    checkpoint: str = "best"
    """best (lowest validation loss), latest, or a step number."""


def _sample(args: Sequence[str]) -> int:
    if args[:1] in (["-h"], ["--help"]):
        parse_config(SampleConfig, SampleConfig(), ["--help"], "jaxtrain sample RUN_DIR")  # exits 0, before JAX
    from jaxtrain.tools import runs

    if not args or args[0].startswith("-"):
        raise ConfigError("usage: jaxtrain sample RUN_DIR [--prompt TEXT] [--length N] [--temperature T] [--top-k K]")
    c = parse_config(SampleConfig, SampleConfig(), args[1:], "jaxtrain sample RUN_DIR")
    print(runs.sample_text(args[0], c.prompt, c.length, c.temperature, c.top_k, c.seed, c.checkpoint))
    return 0


@dataclasses.dataclass(frozen=True)
class PredictConfig:
    """jaxtrain predict RUN_DIR --input FILE --output FILE: a trained run's outputs for raw inputs."""

    input: str = ""
    """Raw inputs, as the training data's samples: .npy, .npz or HDF5 (the array named as the model's
    input field, or the file's only array); .npy and HDF5 are read a batch at a time."""
    output: str = ""
    """Where the outputs go: .npy (one output), .npz or HDF5; written whole or not at all."""
    batch_size: int = 0
    """Rows per compiled call (0: 256, or the inputs' rows if fewer)."""
    checkpoint: str = "best"
    """best (by the run's best metric), latest, or a step number."""
    weights: Literal["raw", "ema"] = "raw"
    """raw: the trained weights; ema: their average (a run trained with --ema)."""
    allow_nonfinite: bool = False
    """Predict input rows that hold NaN or Inf (refused by default, naming the rows)."""


def _predict(args: Sequence[str]) -> int:
    if args[:1] in (["-h"], ["--help"]):
        parse_config(PredictConfig, PredictConfig(), ["--help"], "jaxtrain predict RUN_DIR")  # exits 0, before JAX
    from jaxtrain.tools import runs

    if not args or args[0].startswith("-"):
        raise ConfigError("usage: jaxtrain predict RUN_DIR --input FILE --output FILE [--batch-size N] "
                          "[--checkpoint best|latest|STEP] [--weights raw|ema] [--allow-nonfinite]")
    c = parse_config(PredictConfig, PredictConfig(), args[1:], "jaxtrain predict RUN_DIR")
    if not c.input or not c.output:
        raise ConfigError("jaxtrain predict needs --input FILE (.npy, .npz, .h5) and --output FILE")
    print(runs.predict_files(args[0], c.input, c.output, c.batch_size or None, c.checkpoint, c.weights,
                             c.allow_nonfinite))
    return 0


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """jaxtrain export RUN_DIR --out DIR: a trained run as an artifact that runs without its code."""

    out: str = ""
    """Directory for model.jax_export, signature.json, weights.safetensors and README.md."""
    checkpoint: str = "best"
    """best (by the run's best metric), latest, or a step number."""
    platforms: str = ""
    """Comma-separated platforms the artifact may run on, e.g. cpu,cuda (default: this machine's)."""
    weights: Literal["raw", "ema"] = "raw"
    """raw: the trained weights; ema: their average (a run trained with --ema)."""


def _export(args: Sequence[str]) -> int:
    if args[:1] in (["-h"], ["--help"]):
        parse_config(ExportConfig, ExportConfig(), ["--help"], "jaxtrain export RUN_DIR")  # exits 0, before JAX
    from jaxtrain.tools import runs

    if not args or args[0].startswith("-"):
        raise ConfigError("usage: jaxtrain export RUN_DIR --out DIR [--checkpoint best|latest|STEP] "
                          "[--platforms cpu,cuda] [--weights raw|ema]")
    c = parse_config(ExportConfig, ExportConfig(), args[1:], "jaxtrain export RUN_DIR")
    if not c.out:
        raise ConfigError("jaxtrain export needs --out DIR")
    platforms = tuple(p.strip() for p in c.platforms.split(",") if p.strip())
    print(runs.export_run(args[0], c.out, c.checkpoint, platforms, c.weights))
    return 0


def _plot(args: Sequence[str]) -> int:
    from jaxtrain.engine import plot_run

    rest = list(args)
    _, out = _pop_option(rest, "--out")
    if len(rest) != 1 or rest[0].startswith("-"):
        raise ConfigError("usage: jaxtrain plot RUN_DIR [--out FILE.png]")
    print(plot_run(rest[0], out))
    return 0


def _compare(args: Sequence[str]) -> int:
    usage = "usage: jaxtrain compare RUN_DIR... [--out FILE.png]"
    if list(args) in (["-h"], ["--help"]):
        print(f"{usage}\n\n  the config keys that differ between the runs, their results, and their loss curves "
              "overlaid in one PNG\n  --out FILE.png   the plot (default runs/compare.png)")
        return 0
    from rich.console import Console

    from jaxtrain.tools.report.compare import compare_runs, plot_comparison, print_comparison

    rest = list(args)
    has_out, out = _pop_option(rest, "--out")
    if (has_out and out is None) or not rest or any(a.startswith("-") for a in rest):
        raise ConfigError(usage)
    comparison = compare_runs(rest)
    console = Console(highlight=False, soft_wrap=True)
    print_comparison(comparison, console)
    console.print(f"plot: {plot_comparison(comparison, out or 'runs/compare.png')}")
    return 0


@dataclasses.dataclass(frozen=True)
class DoctorOptions:
    """jaxtrain doctor: check that JAX, the devices and the compiler are set up to train fast."""

    json: bool = False
    """Print the checks as JSON only."""
    expect_device: Literal["any", "cpu", "gpu", "tpu"] = "any"
    """Fail unless JAX's default backend is this kind of device (any: not checked)."""
    expect_devices: int = 0
    """Fail unless JAX sees exactly this many devices, all processes together (0: not checked)."""
    quick: bool = False
    """Smaller sizes and fewer repeats (about a second; the figures are rougher)."""

    def __post_init__(self) -> None:
        if self.expect_devices < 0:
            raise ConfigError(f"--expect-devices must be >= 1 (0: not checked), got {self.expect_devices}")


def _doctor(args: Sequence[str]) -> int:
    import time

    o = parse_config(DoctorOptions, DoctorOptions(), args, "jaxtrain doctor")  # --help exits here, before JAX
    from rich.console import Console

    from jaxtrain.tools.diagnose.doctor import failed, record_matmul_rate, run_checks
    from jaxtrain.tools.report.doctor_report import checks_json, print_checks

    start = time.perf_counter()
    checks = run_checks(o.expect_device, o.expect_devices, quick=o.quick)
    record_matmul_rate(checks, o.quick)  # every run's profile reads it (`jaxtrain._src.machine`)
    seconds = time.perf_counter() - start
    if o.json:
        print(checks_json(checks, seconds))
    else:
        print_checks(checks, Console(highlight=False), seconds)
    return 1 if failed(checks) else 0


def _recipes() -> int:
    from jaxtrain.tools.recipes import CATALOG  # the names and descriptions alone: no JAX

    for name, description in sorted(CATALOG.items()):
        print(f"{name:<20} {description}")
    return 0


def _number(args: list[str], flag: str, kind: type, default: Any) -> Any:
    """Removes `flag VALUE` from `args` and returns VALUE as `kind` (`default` when absent)."""
    present, value = _pop_option(args, flag)
    if not present:
        return default
    if value is None:
        raise ConfigError(f"{flag} needs a positive number after it")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} needs a {'whole ' if kind is int else ''}number; got {value!r}") from None


def train_command(recipe: str, flags: Sequence[str], replaced: Sequence[str]) -> str:
    """`jaxtrain train RECIPE FLAGS` as a shell takes it, less the flags that set one of the dotted
    `replaced` names: the command a tool prints for the settings it measured with, to which it adds
    its own values for `replaced`."""
    from jaxtrain.tools.sweep import without_flags

    return shlex.join(["jaxtrain", "train", recipe, *without_flags(flags, replaced)])


TUNE_MAX_BATCH = 2**16  # `tune.MAX_BATCH`, written here so that the help imports no JAX (a test checks they agree)
TUNE_CHECK_SAMPLES = 2**16  # `tune.CHECK_SAMPLES`, likewise
# `tune batch-size`'s own flags, in its help and (with the recipe's options) in `tune batch-size RECIPE --help`
TUNE_FLAGS = (
    "  --max-memory-gb G    cap of one training step (parameters + optimizer state + batch + temporaries), GiB;\n"
    "                       default: the device's memory (a CPU's: the host's available RAM) less the data fit keeps "
    "on it",
    f"  --max-batch N        the largest batch tried (default {TUNE_MAX_BATCH}; at most half the training set)",
    "  --seconds S          timed training per batch size (default 1)",
    "  --no-throughput      train only the largest batch that fits (the trial), not every power of two up to it",
    "  --check-samples N    training samples of each short run that checks the recommended batch and learning rate\n"
    f"                       against the config's (default {TUNE_CHECK_SAMPLES}, at most one epoch; 0: no check, and "
    "no recommendation)",
    "  --out FILE.png       the plot (default runs/tune-RECIPE-batch-size.png)")


def _tune(args: Sequence[str]) -> int:
    usage = ("usage: jaxtrain tune batch-size RECIPE [--preset NAME] [--max-memory-gb G] [--max-batch N] "
             "[--seconds S] [--no-throughput] [--check-samples N] [--out FILE.png] [OPTIONS]")
    if args[:1] == ["lr"]:
        return _tune_lr(list(args[1:]))
    if args[:1] in (["-h"], ["--help"]) or args[1:2] in (["-h"], ["--help"]):
        listed = "\n".join(TUNE_FLAGS)
        print(f"""{usage}

{listed}
  --preset, OPTIONS    the recipe's settings, as for `jaxtrain train RECIPE` (its --help lists them)

the learning-rate range test: `jaxtrain tune lr --help` ({LR_USAGE.removeprefix("usage: ")})""")
        return 0
    if not args or args[0] != "batch-size":
        given = f" {args[0]!r}" if args else ""
        raise ConfigError(f"unknown tune command{given}; choose one of: batch-size ({usage}), lr ({LR_USAGE})")
    if len(args) < 2 or args[1].startswith("-"):
        raise ConfigError(f"missing recipe; {usage} (see `jaxtrain recipes`)")
    from rich.console import Console

    from jaxtrain.tools.recipes import get_recipe

    recipe, rest = get_recipe(args[1]), list(args[2:])
    max_memory_gb = _number(rest, "--max-memory-gb", float, None)
    max_batch = _number(rest, "--max-batch", int, TUNE_MAX_BATCH)
    seconds = _number(rest, "--seconds", float, 1.0)
    check_samples = _number(rest, "--check-samples", int, None)
    throughput = "--no-throughput" not in rest
    rest = [a for a in rest if a != "--no-throughput"]
    _, out = _pop_option(rest, "--out")
    flags = list(rest)
    config, _ = _preset_config(recipe, rest, f"jaxtrain tune batch-size {recipe.name}", TUNE_FLAGS)  # --help: no JAX
    # the recommendation trains with the settings measured here: the recipe's flags, less those it sets
    command = train_command(recipe.name, flags, ["batch_size", "optim.lr", "optim.min_lr"])
    from jaxtrain.tools import tune
    from jaxtrain.tools.report.tune import plot_batch_size, print_batch_size

    out = out or f"runs/tune-{recipe.name}-batch-size.png"
    console = Console(highlight=False, soft_wrap=True)
    result = tune.batch_size(recipe, config, max_memory_gb, max_batch=max_batch, seconds=seconds,
                             throughput=throughput, check_samples=check_samples,
                             note=lambda line: console.print(f"[dim]{line}[/dim]"))
    print_batch_size(result, console, command)
    console.print(f"plot: {plot_batch_size(result, out)}")
    return 0


SWEEP_USAGE = ("usage: jaxtrain sweep RECIPE [--preset NAME] [TRAIN FLAGS] --space NAME=KIND:ARGS ... --trials N "
               "--out DIR [--storage URL] [--study NAME] [--objective val_loss] [--direction min|max] "
               "[--sampler tpe|random] [--pruner median|hyperband|none] [--seed S] [--workers W] [--heartbeat S] "
               "[--population P [--scheduler none|halving|pbt] [--pbt-every N]]; "
               "jaxtrain sweep report DIR")


def _sweep(args: Sequence[str]) -> int:
    """`jaxtrain sweep RECIPE ...` (a search) and `jaxtrain sweep report DIR`."""
    if not args or args[0] in ("-h", "--help") or "--help" in args[:2] or "-h" in args[:2]:
        print(f"""{SWEEP_USAGE}

  Trains RECIPE once per trial with values drawn by Optuna (TPE by default) for each --space, the
  recipe's other flags fixed; each trial is a run directory DIR/trial-NNNN. The study lives in
  DIR/study.db (or --storage URL: any SQLAlchemy URL, e.g. postgresql://...); running the command
  again continues it until N trials are finished. After each epoch the objective is reported and a
  trial the pruner (median by default) finds behind the others stops there.
  --space NAME=KIND:ARGS   loguniform:A:B, uniform:A:B, int:A:B, choice:V1,V2,... over any config
                           field (optim.lr, model.hidden, batch_size, ...); repeat for each field
  --objective FIELD        an epoch record field (default val_loss); --direction min (default) or max
  --workers W              W processes run trials side by side on the one study (at most the cores);
                           the same command on other machines with one --storage postgresql://...
                           joins them. They end with the sweep; SIGTERM or Ctrl-C ends them, marks
                           their running trials failed and queues their values for the next run
  --seed S                 the sampler's seed (0 to 2**32-1); each trial draws from one derived from
                           it and the trial's number, so workers and later runs never draw alike
  --heartbeat S            seconds between a running trial's heartbeats (default 10); a trial whose
                           worker died is failed after three missed beats and asked again
  --population P           ask P trials at once and train them side by side as one compiled program
                           (trials that differ in more than the optimizer's settings, such as a
                           model's width, are grouped with those they share the rest with; at most
                           1024, and from 64 up the members' states must fit the device's memory)
  --scheduler halving|pbt  adapt the population without compiling again (the space over the
                           optimizer's numbers only): halving refills a slot the pruner stops with
                           the sampler's next trial (fresh weights); pbt, every --pbt-every N epochs
                           (default a quarter of them), copies the best quarter's weights and
                           optimizer state into the worst quarter with perturbed numbers (x0.8/x1.2,
                           or drawn anew), each copy a trial that records its parent. Default none
  jaxtrain sweep report DIR [--study NAME] [--storage URL]: the trials table, the best trial's
  command, parameter importances and plots (history, parallel coordinates, slices) in DIR""")
        return 0
    from rich.console import Console

    from jaxtrain.tools import sweep
    from jaxtrain.tools.recipes import get_recipe

    console = Console(highlight=False, soft_wrap=True)
    rest = list(args[1:])
    _, storage = _pop_option(rest, "--storage")
    _, study_name = _pop_option(rest, "--study")
    if args[0] == "report":
        if not rest or rest[0].startswith("-"):
            raise ConfigError(f"missing the sweep folder; {SWEEP_USAGE}")
        study = sweep.load_study(rest[0], storage, study_name)
        objective = study.user_attrs.get("objective", "val_loss")
        sweep.print_report(study, console, objective)
        for path in sweep.plot_report(study, rest[0]):
            console.print(f"plot: {path}")
        return 0
    recipe = get_recipe(args[0])
    spaces = []
    while "--space" in rest:
        _, spec = _pop_option(rest, "--space")
        if spec is None:
            raise ConfigError(f"--space needs NAME=KIND:ARGS after it; {SWEEP_USAGE}")
        spaces.append(sweep.parse_space(spec))
    trials = _number(rest, "--trials", int, None)
    _, out = _pop_option(rest, "--out")
    if trials is None or out is None:
        raise ConfigError(f"a sweep needs --trials N and --out DIR; {SWEEP_USAGE}")
    _, objective = _pop_option(rest, "--objective")
    _, direction = _pop_option(rest, "--direction")
    _, sampler = _pop_option(rest, "--sampler")
    _, pruner = _pop_option(rest, "--pruner")
    seed = _number(rest, "--seed", int, 0)
    workers = _number(rest, "--workers", int, 1)
    heartbeat = _number(rest, "--heartbeat", int, 10)
    population = _number(rest, "--population", int, 1)
    _, scheduler = _pop_option(rest, "--scheduler")
    pbt_every = _number(rest, "--pbt-every", int, 0)
    if direction not in (None, "min", "max"):
        raise ConfigError(f"--direction {direction}: choose min or max")
    flags = list(rest)
    config, _ = _preset_config(recipe, rest, f"jaxtrain sweep {recipe.name}")
    study = sweep.sweep(recipe, config, spaces, trials, out, storage=storage, study=study_name,
                        objective=objective or "val_loss", direction="maximize" if direction == "max" else "minimize",
                        sampler=sampler or "tpe", pruner=pruner or "median", seed=seed, flags=flags, workers=workers,
                        heartbeat=heartbeat, population=population, scheduler=scheduler or "none",
                        pbt_every=pbt_every, console=console)
    if config.verbosity == "silent":
        return 0
    if config.quiet or config.verbosity == "result":  # the result alone: no table, no hint
        sweep.print_result(study, console, objective or "val_loss", out)
        return 0
    sweep.print_report(study, console, objective or "val_loss", importances=False)
    report = ["jaxtrain", "sweep", "report", out, *(["--storage", storage] if storage else []),
              *(["--study", study.study_name] if storage or study_name else [])]
    console.print(f"parameter importances and plots: {shlex.join(report)}")
    return 0


LR_USAGE = ("usage: jaxtrain tune lr RECIPE [--min-lr A] [--max-lr B] [--steps N] [--check-samples N] [--out FILE.png] "
            "[OPTIONS]")


def _tune_lr(args: list[str]) -> int:
    """`jaxtrain tune lr RECIPE`: the learning-rate range test."""
    if args[:1] in (["-h"], ["--help"]) or args[1:2] in (["-h"], ["--help"]):
        print(f"""{LR_USAGE}

  Trains RECIPE for N steps (default: as many as the run its settings describe, up to 1,000) with
  its optimizer while the learning rate grows from A (default 1e-7) to B (default 10) by the same
  factor each step, and suggests a tenth of the learning rate where the smoothed loss is lowest.
  The suggestion is recommended only where a short run at it (--check-samples, default {TUNE_CHECK_SAMPLES}
  samples, at most one epoch) reached a loss no higher than one at the config's rate, from the same
  initial weights and data order.
  The run's initial weights and data are the recipe's; nothing is written but the plot.
  --check-samples N   training samples of each of the two short runs that check the suggestion (0: no check,
                      and no recommendation)
  --out FILE.png      the plot (default runs/tune-RECIPE-lr.png)
  --preset, OPTIONS   the recipe's settings, as for `jaxtrain train RECIPE` (its --help lists them)""")
        return 0
    if not args or args[0].startswith("-"):
        raise ConfigError(f"missing recipe; {LR_USAGE} (see `jaxtrain recipes`)")
    from rich.console import Console

    from jaxtrain.tools import tune
    from jaxtrain.tools.recipes import get_recipe
    from jaxtrain.tools.report.tune import plot_lr_range, print_lr_range

    recipe, rest = get_recipe(args[0]), args[1:]
    min_lr = _number(rest, "--min-lr", float, 1e-7)
    max_lr = _number(rest, "--max-lr", float, 10.0)
    steps = _number(rest, "--steps", int, None)
    check_samples = _number(rest, "--check-samples", int, None)
    _, out = _pop_option(rest, "--out")
    command = train_command(recipe.name, rest, ["optim.lr"])  # the suggestion holds for these settings only
    config, _ = _preset_config(recipe, rest, f"jaxtrain tune lr {recipe.name}")
    result = tune.lr_range(recipe, config, min_lr, max_lr, steps, check_samples=check_samples)
    console = Console(highlight=False, soft_wrap=True)
    print_lr_range(result, console, recipe.name, config.optim.name, command)
    console.print(f"plot: {plot_lr_range(result, recipe.name, out or f'runs/tune-{recipe.name}-lr.png')}")
    return 0


SCAN_USAGE = "usage: jaxtrain scan PATH... [--format text|json] [--fail-on high|medium|low|never]"


def _scan(args: Sequence[str]) -> int:
    from rich.console import Console

    from jaxtrain.tools.diagnose.scan import FAIL_ON, scan_paths
    from jaxtrain.tools.report.scan_report import print_findings, print_json, print_rules

    if "-h" in args or "--help" in args:
        print(f"""{SCAN_USAGE}

  Reads Python files (a directory: every *.py under it) without running them and reports the
  anti-patterns that make JAX training slow, each with why, the fix and the expected gain.
  --format text|json   linter-style lines and a summary table (default), or JSON
  --fail-on SEVERITY   exit 1 when a finding of this severity or worse exists (default never: exit 0)
  A line ending in `# jaxtrain: ignore` or `# jaxtrain: ignore[RULE,...]` is not reported.
""")
        print_rules(Console(highlight=False))
        return 0
    rest = list(args)
    has_format, fmt = _pop_option(rest, "--format")
    has_fail_on, fail_on = _pop_option(rest, "--fail-on")
    if has_format and fmt not in ("text", "json"):
        raise ConfigError(f"--format {fmt or ''}: choose text or json; {SCAN_USAGE}")
    if has_fail_on and fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on {fail_on or ''}: choose one of {', '.join(FAIL_ON)}; {SCAN_USAGE}")
    unknown = [a for a in rest if a.startswith("-")]
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]}; {SCAN_USAGE}")
    result = scan_paths(rest)
    if fmt == "json":
        print_json(result)
    else:
        print_findings(result, Console(highlight=False))
    return 1 if result.fails(fail_on or "never") else 0


PROFILE_USAGE = "usage: jaxtrain profile RECIPE [--preset NAME] [OPTIONS] [--seconds S] [--trace DIR]"


def _profile(args: Sequence[str]) -> int:
    from jaxtrain.tools.diagnose.profile import DEFAULT_SECONDS, profile_recipe

    if args[:1] in (["-h"], ["--help"]) or args[1:2] in (["-h"], ["--help"]):
        print(f"""{PROFILE_USAGE}

  Trains RECIPE for one epoch or S seconds of training, whichever ends first (no validation, no
  checkpoints, no run directory), and prints where the wall time went: compilation (and why each
  program was compiled), input wait, copies to the device, compute, per-call dispatch overhead, host
  syncs; the FLOP/s achieved against the device's float32 matmul rate; a verdict (input-, dispatch-,
  host-sync- or compute-bound) and the two changes that would help most. Every `jaxtrain train` run
  ends with the same profile in its final block and in summary.json.
  --seconds S     training profiled at most (default {DEFAULT_SECONDS:g})
  --trace DIR     also write a jax.profiler trace of the training to DIR (TensorBoard profile plugin, Perfetto)
  --preset, OPTIONS   the recipe's settings, as for `jaxtrain train RECIPE` (its --help lists them)""")
        return 0
    if not args or args[0].startswith("-"):
        raise ConfigError(f"missing recipe; {PROFILE_USAGE} (see `jaxtrain recipes`)")
    from rich.console import Console

    from jaxtrain.engine import memory_lines, profile_lines
    from jaxtrain.tools.recipes import get_recipe

    recipe = get_recipe(args[0])
    rest = _aliased(recipe, args[1:])
    seconds = _number(rest, "--seconds", float, DEFAULT_SECONDS)
    has_trace, trace = _pop_option(rest, "--trace")
    if has_trace and trace is None:
        raise ConfigError(f"--trace needs a directory; {PROFILE_USAGE}")
    if _option_value(rest, "--run-dir") is not None:
        raise ConfigError("jaxtrain profile writes no run directory (nothing of the run is kept); drop --run-dir, or "
                          "train with `jaxtrain train`: every run's summary.json holds the same profile")
    config, _ = _preset_config(recipe, rest, f"jaxtrain profile {recipe.name}")
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"profiling {recipe.name}: one epoch or {seconds:g} s of training, no validation ...")
    profile = profile_recipe(recipe, config, seconds, trace)
    for line in [*profile_lines(profile), *(["", *memory_lines(profile["memory"])] if profile["memory"] else [])]:
        console.print(line, markup=False)
    if trace:
        files = [p for p in Path(trace).rglob("*") if p.is_file()]
        console.print(f"trace: {len(files)} files under {trace} (tensorboard --logdir {trace}, or open the "
                      ".trace.json.gz in https://ui.perfetto.dev)", markup=False)
    return 0


def _summary(args: Sequence[str]) -> int:
    import json

    from jaxtrain.engine import summary_lines
    from jaxtrain.tools import runs
    from jaxtrain.tools.recipes import get_recipe

    usage = "usage: jaxtrain summary RECIPE [--preset NAME] [--json] [OPTIONS]"
    if not args or args[0].startswith("-"):
        raise ConfigError(f"missing recipe; {usage} (see `jaxtrain recipes`)")
    recipe = get_recipe(args[0])
    rest = _aliased(recipe, args[1:])
    as_json = "--json" in rest
    rest = [a for a in rest if a != "--json"]
    config, _ = _preset_config(recipe, rest, f"jaxtrain summary {recipe.name}")
    summary = runs.summarize(recipe, config)
    if as_json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{recipe.name}: a training batch of {summary['batch_size']}")
    print("\n".join(summary_lines(summary, flops=summary["flops_per_step"])))
    return 0


# Where the repository's benchmarks/ sits beside src/ (the wheel installs no benchmark: they sit above the tools)
CHECKOUT = Path(__file__).resolve().parents[3]


def _benchmarks() -> Any:
    """The checkout's `benchmarks` package, its folder put first on sys.path; a ConfigError without a checkout."""
    if not (CHECKOUT / "benchmarks" / "__init__.py").is_file():
        raise ConfigError("jaxtrain bench runs from a checkout of the repository: benchmarks/ is not installed "
                          "with the package (clone the repository, `pip install -e .` there, and run it again)")
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    return importlib.import_module("benchmarks")


def _bench(args: Sequence[str]) -> int:
    benchmarks = _benchmarks()
    if not args or args[0] not in benchmarks.BENCHMARKS:
        given = f" {args[0]!r}" if args else ""
        raise ConfigError(f"unknown benchmark{given}; choose one of: {', '.join(sorted(benchmarks.BENCHMARKS))}")
    config_cls, main = benchmarks.benchmark(args[0])
    config = parse_config(config_cls, config_cls(), args[1:], f"jaxtrain bench {args[0]}")
    return main(config)


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """Options of `jaxtrain data generate WORKLOAD OUT.h5`."""

    samples: int
    """Rows to write (up to 10^8; memory stays bounded)."""
    seq_len: int = 128
    """Sequence length L (sequence workload)."""
    chunk_rows: int | None = None
    """Rows per HDF5 chunk; default chunks of about 512 KiB."""
    compression: Literal["none", "gzip", "lzf"] = "none"
    """Chunk compression."""
    seed: int = 0
    """Dataset seed."""
    format: Literal["hdf5", "npy"] = "hdf5"
    """hdf5: one file OUT.h5; npy: a folder OUT of .npy shards (NAME-00000.npy, ...) and attrs.json,
    as `jaxtrain.data.NpySource` and the recipes' --data.npy read them."""
    shard_rows: int = 131072
    """Rows per .npy shard (format npy)."""
    force: bool = False
    """Replace OUT if it exists."""
    quiet: bool = False
    """No progress bar."""


def _data_generate(args: Sequence[str]) -> int:
    prog = "jaxtrain data generate WORKLOAD OUT.h5"
    positional = [a for a in args[:2] if not a.startswith("-")]
    if len(positional) < 2 and not ("-h" in args or "--help" in args):
        from jaxtrain.engine import WORKLOADS

        raise ConfigError(f"usage: {prog} --samples N [OPTIONS]; WORKLOAD is one of: {', '.join(WORKLOADS)}")
    o = parse_config(GenerateOptions, None, list(args[len(positional):]), prog)  # --help exits here, before JAX
    from rich.console import Console

    from jaxtrain.data import generate_dataset
    from jaxtrain.engine import check_generate_arguments
    from jaxtrain.tools.report.data_report import print_generated, row_progress

    workload, out = positional
    check_generate_arguments(workload, out, o.samples, o.seq_len, o.chunk_rows, o.compression, o.seed, o.force)
    console = Console()
    with row_progress(workload, o.samples, console, quiet=o.quiet) as on_rows:
        result = generate_dataset(workload, out, o.samples, seq_len=o.seq_len, chunk_rows=o.chunk_rows,
                                  compression=o.compression, seed=o.seed, force=o.force, on_rows=on_rows,
                                  format=o.format, shard_rows=o.shard_rows)
    print_generated(result, console)
    return 0


@dataclasses.dataclass(frozen=True)
class InspectOptions:
    """Options of `jaxtrain data inspect FILE`."""

    rows: int = 100_000
    """Rows to sample per dataset for the statistics."""
    json: bool = False
    """Print the report as JSON."""


def _data_inspect(args: Sequence[str]) -> int:
    prog = "jaxtrain data inspect FILE"
    if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help")):
        raise ConfigError(f"usage: {prog} [--rows N] [--json]")
    rest = list(args[1:]) if not args[0].startswith("-") else list(args)
    options = parse_config(InspectOptions, InspectOptions(), rest, prog)  # --help exits here, before JAX
    import json

    from rich.console import Console

    from jaxtrain.data import inspect_file
    from jaxtrain.tools.peak_memory import peak_rss_bytes
    from jaxtrain.tools.report.data_report import print_inspection

    report = {**inspect_file(args[0], options.rows), "peak_rss_bytes": peak_rss_bytes()}
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        print_inspection(report, Console())
    return 0


def _data(args: Sequence[str]) -> int:
    commands = {"generate": _data_generate, "inspect": _data_inspect}
    if not args or args[0] not in commands:
        given = f" {args[0]!r}" if args else ""
        raise ConfigError(f"unknown data command{given}; choose one of: {', '.join(commands)}")
    return commands[args[0]](args[1:])


# `jaxtrain COMMAND --help` of the commands that have no help of their own: their lines of USAGE
USAGE_HELP = ("train", "eval", "plot", "summary", "recipes", "bench", "data")


def _command_usage(command: str) -> str:
    """The entries of USAGE for `command` (each entry's first line and the more indented lines under it),
    with `jaxtrain` before the command; for `train`, the recipes' names too."""
    lines, keep = [], False
    for line in USAGE.splitlines():
        entry = line.startswith("  ") and not line.startswith("   ")
        if entry:
            keep = line.split()[0] == command
        keep = keep and line.startswith("  ")
        if keep:
            lines.append(f"  jaxtrain {line[2:]}" if entry else line)
    if command == "train":
        from jaxtrain.tools.recipes import CATALOG

        lines.append(f"\nrecipes: {', '.join(sorted(CATALOG))} (`jaxtrain recipes` says what each trains)")
    return "usage:\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code (0 ok, 2 bad input, 3 non-finite loss)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    if args == ["--version"]:
        print(f"jaxtrain {__version__}")
        return 0
    command, rest = args[0], args[1:]
    try:
        _refuse_completion(args)  # before JAX is imported: nothing of the command runs
    except ConfigError as e:
        print(f"error: {e.for_cli()}", file=sys.stderr)
        return e.exit_code
    if rest[:1] in (["-h"], ["--help"]) and command in USAGE_HELP:
        print(_command_usage(command))
        return 0
    # Orbax's writer threads log each failed write with a traceback; the one-line error below says it.
    # absl.logging first: it makes the "absl" logger of its own class, which a plain logger of that
    # name made here would stand in for (`import jaxtrain` no longer imports it).
    import absl.logging  # noqa: F401

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited")  # orbax, after a failed save
    warnings.filterwarnings("ignore", message="Enable tracemalloc")

    commands = {"train": lambda: _train(rest), "eval": lambda: _eval(rest), "plot": lambda: _plot(rest),
                "sample": lambda: _sample(rest), "predict": lambda: _predict(rest),
                "export": lambda: _export(rest), "summary": lambda: _summary(rest),
                "compare": lambda: _compare(rest), "doctor": lambda: _doctor(rest),
                "recipes": _recipes, "tune": lambda: _tune(rest),
                "bench": lambda: _bench(rest), "data": lambda: _data(rest), "scan": lambda: _scan(rest),
                "sweep": lambda: _sweep(rest),
                "profile": lambda: _profile(rest)}
    if _compiles(command, rest):
        from jaxtrain import enable_compile_cache, limit_free_heap

        enable_compile_cache()  # programs compiled by an earlier run load from disk (JAXTRAIN_COMPILE_CACHE=off)
        limit_free_heap()  # the C heap's free memory given back, not kept by XLA's threads (JAXTRAIN_HEAP=off)
    previous = _stop_on_sigterm(command)
    # While the command runs, the library's errors and notes name settings as its flags.
    try:
        with rendering("cli"):
            try:
                if command not in commands:
                    raise ConfigError(f"unknown command {command!r}; choose one of: {', '.join(commands)}")
                return commands[command]()
            except JaxtrainError as e:
                print(f"error: {e.for_cli()}", file=sys.stderr)
                return e.exit_code
            except ImportError as e:  # an optional package a feature imports: one line naming its extra
                error = _missing_package(e, command)
                if error is None:
                    raise
                print(f"error: {error.for_cli()}", file=sys.stderr)
                return error.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _missing_package(e: ImportError, command: str) -> Any:
    """The one-line ConfigError for `e` when it is an optional package's (or one of jaxtrain's own
    dependencies') import, else None. The benchmarks' PyTorch comes from the "bench" extra."""
    from jaxtrain.engine import missing_package

    return missing_package(e, f"jaxtrain {command}", {"torch": "bench"} if command == "bench" else None)


def _refuse_completion(args: Sequence[str]) -> None:
    """Refuses tyro's own flags (`--tyro-write-completion SHELL FILE`, `--tyro-print-completion
    SHELL`), which tyro accepts on every command it parses: its script would be for one command
    line (`jaxtrain train mlp-regression` registered as three programs), not for `jaxtrain` and its
    commands, and the parse then ended with exit code 2 after writing it. jaxtrain offers no shell
    completion, so nothing is written."""
    for arg in args:
        if arg.replace("_", "-").startswith("--tyro-"):
            raise ConfigError(f"{arg}: jaxtrain offers no shell completion (tyro's script would complete one "
                              "command's options, not jaxtrain's commands); nothing was written")


def _stop_on_sigterm(command: str) -> Any:
    """SIGTERM ends the command with one line and exit code 143 from its first moment; `fit` takes
    the signal over while it trains (and saves first). Returns the previous handler, or None where
    handlers cannot be set (not the main thread).

    Before `fit` nothing of a run is written yet, so the process ends at once: an exception raised
    from the handler could land inside JAX or HDF5 calls and crash the interpreter on its way out."""

    def handle(signum: int, frame: Any) -> None:
        detail = " before training started; nothing was written" if command == "train" else ""
        remove_partials()  # a file being written (predict's output, ...) leaves no partial copy
        print(f"stopped by SIGTERM{detail}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handle)


def _compiles(command: str, rest: Sequence[str]) -> bool:
    """Whether the command compiles (imports JAX); its help does not."""
    return command in COMPILING and not ("-h" in rest or "--help" in rest)


def entry_point() -> None:
    """The `jaxtrain` command's process: `main`, with a compiling command's imports kept out of the
    cycle collector's walks (`imports_outside_gc`: about 0.3 s of a short run's 2.9 CPU seconds),
    and the interpreter's teardown skipped after `train`. Ctrl-C while it imports ends it with
    `main`'s one line and exit code; a reader that stops reading (`jaxtrain ... | head`) ends it
    quietly, exit code 141 as for SIGPIPE."""
    seen: list[int] = []  # Ctrl-C while importing: jaxlib's extension reports it as an ImportError of its own

    def interrupt(signum: int, frame: Any) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    try:
        if sys.argv[1:2] and _compiles(sys.argv[1], sys.argv[2:]):
            from jaxtrain.engine import imports_outside_gc

            previous = signal.signal(signal.SIGINT, interrupt)
            with imports_outside_gc():
                from jaxtrain.engine import run  # noqa: F401 - the loop's module: JAX, Flax, Optax, jaxtrain
            signal.signal(signal.SIGINT, previous)
        code = main()
    except (KeyboardInterrupt, ImportError) as e:  # before `main` took over (it says the same); nothing written yet
        if isinstance(e, ImportError) and not seen:  # a broken install, not Ctrl-C
            error = _missing_package(e, sys.argv[1])
            if error is None:
                raise
            print(f"error: {error.for_cli()}", file=sys.stderr, flush=True)
            sys.exit(error.exit_code)
        print("interrupted", file=sys.stderr, flush=True)
        os._exit(130)  # not the interpreter's teardown of modules the signal left half imported
    except BrokenPipeError:
        # Whatever is still buffered for the closed pipe goes nowhere, so that the exit does not fail on it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    if sys.argv[1:2] == ["train"] and _nothing_left_running():
        # The run's files are closed and its threads done: skip the interpreter's teardown of JAX,
        # Orbax and every imported module (about 1 s of a 2-core machine; docs/benchmarks.md).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _nothing_left_running() -> bool:
    """Whether only daemon threads remain and this is a one-process job (several processes shut
    JAX's distributed service down at exit)."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return False
    jax = sys.modules.get("jax")
    return jax is None or not jax.distributed.is_initialized()
