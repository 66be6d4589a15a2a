"""`jaxtrain bench scale`: one recipe trained on six meshes of 4 virtual CPU devices.

Every mesh (`data=1`, `data=2`, `data=4`, `fsdp=2`, `fsdp=4`, `data=2,fsdp=2`) trains the same
recipe config (fixed K steps per call, small data) in ONE child process started with
`XLA_FLAGS=--xla_force_host_platform_device_count=4`; a mesh of fewer than 4 devices uses the
first ones (`make_layout`). Per mesh it reports:

- param+opt bytes per device: `shard_bytes((params, opt_state))` of the trained state, read from
  the arrays' shards on device 0 (every mesh includes device 0);
- peak bytes per device of the compiled K-step call, from XLA's `memory_analysis()`:
  arguments + outputs + temporaries - aliased (donated state counted once). The arguments include
  the training set when it is held on the device (it is, at these sizes): reported separately;
- ms per step: the median over the timed epochs of the epoch's `train_time_s` (compile excluded)
  over its steps; the first epoch is a warm-up and is not timed;
- collective bytes per step, parsed from the compiled K-step call's HLO (`collective_stats`);
- the largest relative difference from the `data=1` run of the final parameters (relative L2 per
  array) and of every epoch's train and validation loss.

Virtual CPU devices share the machine's cores: the step times show the cost of partitioning and
at most the use of otherwise idle cores, never scaling. `--compile-only gpt2-small` compiles
(never trains) the char-gpt step at GPT-2-small's shape from abstract shapes, to read its
collectives and memory without allocating it. Both build the train step as `fit` does (with the
layout's `gather_params` and `split_grads`: FSDP as ZeRO-3).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from benchmarks.child import child_main, run_child

DEVICES = 4  # virtual CPU devices of the child process (--compile-only may ask for more with --devices)
MESHES = ("data=1", "data=2", "data=4", "fsdp=2", "fsdp=4", "data=2,fsdp=2")
FSDP_TARGET = 0.3  # per-device param+opt bytes of fsdp=4 over data=4's
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
SHAPES = {  # --compile-only: char-gpt's model at these shapes
    "baby": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "vocab": 65},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab": 50257},
}


def compile_meshes(n: int) -> tuple[str, ...]:
    """The meshes --compile-only compiles on n devices."""
    return ("data=1", f"data={n}", f"fsdp={n}", f"data=2,fsdp={n // 2}")


@dataclasses.dataclass(frozen=True)
class ScaleBenchConfig:
    """Settings of the scale benchmark."""

    recipe: Literal["mlp-regression", "char-gpt"] = "mlp-regression"
    """The recipe to train on every mesh (its default config, with the sizes below)."""
    steps: int = 16
    """Optimizer steps per epoch; each of the `repeats` timed epochs is one step-time sample. The run is
    kept to a few dozen steps: float32 rounding differs between meshes and training can amplify it
    (see docs/benchmarks.md)."""
    steps_per_call: int = 8
    """K: steps fused into one compiled call (fixed, the same on every mesh)."""
    repeats: int = 3
    """Timed epochs per mesh (after one warm-up epoch); the median is reported."""
    text_chars: int = 100_000
    """char-gpt: characters of Tiny Shakespeare used (data.limit), to keep building the data quick."""
    compile_only: Literal["no", "baby", "gpt2-small"] = "no"
    """Compile only, no training: the char-gpt step at this model shape (baby: the recipe's 4 layers,
    4 heads, 128 wide, block 64, vocabulary 65; gpt2-small: 12 layers, 12 heads, 768 wide, block 1024,
    vocabulary 50257) from abstract shapes, nothing allocated, on data=1, data=N, fsdp=N and
    data=2,fsdp=N/2, N = --devices; the step is built as `fit` builds it."""
    batch_per_device: int = 1
    """--compile-only: sequences (of block_size tokens) per device in the compiled step."""
    devices: int = DEVICES
    """--compile-only: virtual CPU devices (an even number >= 2); training always uses 4."""
    quick: bool = False
    """A tiny run for smoke tests (8 steps per epoch, K=4, one timed epoch, small data)."""
    out: str | None = None
    """Write the results as JSON to this file."""


# --- collectives in compiled HLO text ------------------------------------------------------------

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.*?)\s"
                          r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                          r"(?P<suffix>-start|-done)?\((?P<operands>[^)]*)\)")
_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_CALLEE = re.compile(r"\b(?P<how>body|condition|calls|to_apply|true_computation|false_computation)"
                     r"=%?(?P<name>[\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{(?P<names>[^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")


def _type_bytes(type_text: str) -> float:
    """Bytes of an HLO type: an array `f32[512,128]{1,0}` or a tuple of arrays."""
    total = 0.0
    for dtype, dims in _SHAPE.findall(type_text):
        if dtype == "token":
            continue
        width = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else None)
        if width is None:
            raise ValueError(f"unknown HLO element type {dtype!r} in {type_text!r}")
        total += width * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _group_size(line: str, devices: int) -> int:
    """Devices in each replica group of a collective (all of them when the groups are not given)."""
    if m := re.search(r"replica_groups=\{(\{[^}]*\})", line):  # explicit: {{0,1},{2,3}}
        return len([x for x in m.group(1).strip("{}").split(",") if x.strip()])
    if m := re.search(r"replica_groups=\[(\d+)(?:,(\d+))?\]<=", line):  # iota: [groups,size]<=[...]
        return int(m.group(2) or m.group(1))
    if m := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line):  # mesh['a'=4,'b'=1] {'a'}
        sizes = {k.strip(" '\""): int(v) for k, v in (part.split("=") for part in m.group(1).split(","))}
        return math.prod(sizes[a.strip(" '\"")] for a in m.group(2).split(",") if a.strip())
    return devices


def _ring_factor(kind: str, n: int) -> float:
    """Bytes each device sends per byte of S with bandwidth-optimal (ring) algorithms."""
    if n <= 1:
        return 0.0
    return {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(kind, (n - 1) / n)


def collective_stats(hlo_text: str, devices: int, steps: int) -> dict[str, Any]:
    """Collectives per training step of a compiled K-step call, from its HLO text.

    Counting convention: each executed collective counts S bytes, the size of the whole logical
    array it combines (NCCL's S): the result of an all-reduce, the gathered result of an
    all-gather, the operand of a reduce-scatter (result x group size), the operands (= results)
    of an all-to-all or collective-permute; tuples are summed. "sent" is what each device sends
    with ring algorithms: 2(n-1)/n·S for all-reduce, (n-1)/n·S for all-gather, reduce-scatter and
    all-to-all, S for collective-permute, n the group size. An instruction counts once per
    execution: instructions in a while body (the K-step scan) count its trip count
    (`known_trip_count`; K when XLA did not record one), those outside it once per call; the
    totals are divided by `steps` (K). Async pairs count once (at their `-done`).

    Returns:
      {"bytes": S per step, "sent": bytes sent per device per step, "unknown_trip_counts": n,
       "kinds": {kind: {"count": executions per step, "bytes": ..., "sent": ...}}}
    """
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        if current is None:
            if not line.startswith((" ", "HloModule")) and (m := _HEADER.match(line)):
                current = m.group("name")
                computations[current] = []
                entry = current if m.group("entry") else entry
        elif line.strip() == "}":
            current = None
        else:
            computations[current].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")

    callers: dict[str, list[tuple[str, float]]] = {}
    unknown = 0
    for name, lines in computations.items():
        for line in lines:
            for m in _CALLEE.finditer(line):
                times = 1.0
                if m.group("how") == "body":
                    trip = _TRIP_COUNT.search(line)
                    unknown += trip is None
                    times = float(trip.group(1)) if trip else float(steps)
                callers.setdefault(m.group("name"), []).append((name, times))
            for m in _BRANCHES.finditer(line):
                for callee in m.group("names").split(","):
                    callers.setdefault(callee.strip().lstrip("%"), []).append((name, 1.0))

    memo: dict[str, float] = {entry: 1.0}

    def executions(name: str) -> float:
        if name not in memo:
            memo[name] = 0.0  # guards against cycles (HLO has none)
            memo[name] = sum(executions(caller) * times for caller, times in callers.get(name, []))
        return memo[name]

    kinds = {kind: {"count": 0.0, "bytes": 0.0, "sent": 0.0} for kind in KINDS}
    for name, lines in computations.items():
        starts = {}
        for line in lines:
            m = _INSTRUCTION.match(line)
            if m is None:
                continue
            if m.group("suffix") == "-start":
                starts[m.group("name")] = line
                continue
            attributes = line
            if m.group("suffix") == "-done":  # groups are on the start; its operand names it
                attributes = starts.get(m.group("operands").strip().lstrip("%"), line)
            kind, n = m.group("op"), _group_size(attributes, devices)
            size = _type_bytes(m.group("type")) * (n if kind == "reduce-scatter" else 1)
            times = executions(name) / steps
            kinds[kind]["count"] += times
            kinds[kind]["bytes"] += times * size
            kinds[kind]["sent"] += times * size * _ring_factor(kind, n)
    return {"bytes": sum(k["bytes"] for k in kinds.values()), "sent": sum(k["sent"] for k in kinds.values()),
            "unknown_trip_counts": unknown, "kinds": kinds}


# --- the child: every mesh in one process of 4 devices ------------------------------------------

def _recipe_config(payload: dict[str, Any]) -> tuple[Any, Any]:
    from jaxtrain.tools.recipes import get_recipe

    recipe = get_recipe(payload["recipe"])
    base, steps = recipe.config, payload["steps"]
    if recipe.name == "mlp-regression":
        val = 64 if payload["quick"] else 256
        data = dataclasses.replace(base.data, samples=steps * base.batch_size + val, val_samples=val)
    else:
        data = dataclasses.replace(base.data, limit=payload["text_chars"], eval_batches=2 if payload["quick"] else 4)
    config = dataclasses.replace(base, epochs=payload["repeats"] + 1, steps_per_epoch=steps,
                                 steps_per_call=payload["steps_per_call"], log_every=steps, data=data, quiet=True,
                                 tensorboard=False)
    return recipe, config


def _rel_l2(got: Any, want: Any) -> float:
    import numpy as np

    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    norm = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / (norm if norm > 0 else 1.0)


def _memory(compiled: Any) -> dict[str, int] | None:
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    parts = {"argument": stats.argument_size_in_bytes, "output": stats.output_size_in_bytes,
             "temp": stats.temp_size_in_bytes, "alias": stats.alias_size_in_bytes}
    return {**parts, "peak": parts["argument"] + parts["output"] + parts["temp"] - parts["alias"]}


def _train_mesh(recipe: Any, config: Any, mesh: str) -> tuple[dict[str, Any], Any, list[tuple[float, float]]]:
    """Trains `recipe` on `mesh`: (record, final parameters, every epoch's (train, val) loss)."""
    import jax
    import numpy as np

    from jaxtrain._src.hooks import RunHook
    from jaxtrain._src.sharding import shard_bytes, state_bytes_per_device
    from jaxtrain.engine import RunOptions, run

    config = dataclasses.replace(config, mesh=mesh)
    w = recipe.build(config)
    seen: dict[str, Any] = {}
    class KeepRun(RunHook):  # the run's compiled calls, layout and feed
        def on_start(self, run: Any) -> None:
            seen.update(run=run)

    keep_run = KeepRun()
    try:
        result = run(w.model, w.loss_fn, w.train, w.val, config, hooks=[keep_run],
                     preprocess=w.preprocess, augment=w.augment, verbosity="summary",
                     session=RunOptions(name=recipe.name, console=Console(file=io.StringIO())))
    finally:
        w.close()
    run = seen["run"]
    compiled = run.calls.get(config.steps_per_call)
    state = (result.state.params, result.state.opt_state)
    timed = [r["train_time_s"] / config.steps_per_epoch for r in result.history[1:]] or \
            [result.history[0]["train_time_s"] / config.steps_per_epoch]
    record = {
        "mesh": mesh,
        "layout": result.summary["mesh"],
        "devices": run.layout.num_devices,
        "state_bytes": shard_bytes(state),
        "state_bytes_predicted": state_bytes_per_device(run.layout, state),
        "data_bytes": int(getattr(run.feed, "device_bytes", 0)),
        "memory": _memory(compiled),
        "ms_per_step": statistics.median(timed) * 1e3,
        "ms_per_step_epochs": [t * 1e3 for t in timed],
        "collectives": collective_stats(compiled.as_text(), run.layout.num_devices, config.steps_per_call),
        "compile_s": run.calls.compile_s,
    }
    losses = [(r["train_loss"], r.get("val_loss")) for r in result.history]
    return record, jax.tree.map(np.asarray, result.state.params), losses


def _child(payload: dict[str, Any]) -> dict[str, Any]:
    import jax

    from jaxtrain._src.report import device_description

    if jax.device_count() < payload["devices"]:
        raise RuntimeError(f"the benchmark child has {jax.device_count()} devices, needs {payload['devices']} "
                           f"(XLA_FLAGS={os.environ.get('XLA_FLAGS')!r})")
    if payload.get("compile_only", "no") != "no":
        return _compile_only(payload)
    recipe, config = _recipe_config(payload)
    reference: tuple[Any, Any] | None = None

    def compare(record: dict[str, Any], params: Any, losses: list[tuple[float, float]]) -> dict[str, Any]:
        ref_params, ref_losses = reference or (params, losses)
        record["max_param_rel_diff"] = max(_rel_l2(a, b) for a, b in
                                           zip(jax.tree.leaves(params), jax.tree.leaves(ref_params), strict=True))
        record["loss_rel_diff_per_epoch"] = [
            max((abs(a - b) / abs(b) for a, b in zip(pair, ref) if a is not None and b), default=0.0)
            for pair, ref in zip(losses, ref_losses, strict=True)]
        record["max_loss_rel_diff"] = max(record["loss_rel_diff_per_epoch"])
        return record

    rows = []
    for mesh in payload["meshes"]:
        record, params, losses = _train_mesh(recipe, config, mesh)
        rows.append(compare(record, params, losses))
        reference = reference or (params, losses)
    return {"recipe": recipe.name, "device": device_description(jax.devices()[0]), "jax_version": jax.__version__,
            "param_bytes": int(sum(x.nbytes for x in jax.tree.leaves(reference[0]))), "batch_size": config.batch_size,
            "steps_per_epoch": config.steps_per_epoch, "steps_per_call": config.steps_per_call,
            "timed_epochs": max(config.epochs - 1, 1), "meshes": rows}


def _compile_only(payload: dict[str, Any]) -> dict[str, Any]:
    """The char-gpt K-step call at a model shape, compiled from abstract shapes on each mesh
    (nothing of the model is allocated): collectives, memory analysis, param+opt bytes per device
    (from the layout's rule: there are no arrays to read shards from). The step is built as `fit`
    builds it (`loop.py`): with the layout's `gather_params` and `split_grads`."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxtrain._src.feeds import StackedBatches
    from jaxtrain._src.models.gpt import GPT, GPTConfig, num_params
    from jaxtrain._src.program import build_program
    from jaxtrain._src.report import device_description
    from jaxtrain._src.sharding import make_layout, state_bytes_per_device
    from jaxtrain.tools.recipes import get_recipe
    from jaxtrain.tools.recipes.char_gpt import lm_loss

    shape = SHAPES[payload["compile_only"]]
    config = get_recipe("char-gpt").config
    model_config = GPTConfig(**{k: v for k, v in shape.items() if k != "vocab"})
    k, total_steps = payload["steps_per_call"], config.optim.decay_steps
    abstract_model = nnx.eval_shape(lambda: GPT(shape["vocab"], model_config, rngs=nnx.Rngs(0)))
    rows = []
    for mesh in payload["meshes"]:
        layout = make_layout(mesh, jax.devices()[:payload["devices"]])
        batch = payload["batch_per_device"] * layout.num_devices
        program = build_program(abstract_model, lm_loss, config, total_steps=total_steps, layout=layout, abstract=True)
        state = program.state
        tokens = jax.ShapeDtypeStruct((batch, shape["block_size"] + 1), jnp.int32)
        calls = program.calls(k, source=StackedBatches({"tokens": tokens}, layout), form="scan")  # the fused call
        compiled = calls.get(k)
        rows.append({
            "mesh": mesh, "layout": layout.describe(), "devices": layout.num_devices, "batch": batch,
            "state_bytes": state_bytes_per_device(layout, (state.params, state.opt_state)),
            "memory": _memory(compiled), "compile_s": calls.compile_s,
            "collectives": collective_stats(compiled.as_text(), layout.num_devices, k),
        })
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params))
    return {"recipe": f"char-gpt at the {payload['compile_only']} shape (compile only)",
            "device": device_description(jax.devices()[0]), "jax_version": jax.__version__,
            "model": {**shape, "params": num_params(abstract_model, exclude_position=False)},
            "param_bytes": param_bytes, "steps_per_call": k, "batch_per_device": payload["batch_per_device"],
            "meshes": rows}


# --- the parent: start the child, print the table ------------------------------------------------

def _devices_env(n: int) -> dict[str, str]:
    """Environment variables that give a child process `n` virtual CPU devices."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", "")).split()
    return {"XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={n}"]), "JAX_PLATFORMS": "cpu"}


def _mib(n: float) -> str:
    return f"{n / 2**20:,.3f}"


def _fsdp_ratio(rows: list[dict[str, Any]]) -> float | None:
    by_mesh = {r["mesh"]: r for r in rows}
    if "fsdp=4" in by_mesh and "data=4" in by_mesh:
        return by_mesh["fsdp=4"]["state_bytes"] / by_mesh["data=4"]["state_bytes"]
    return None


def _print(console: Console, results: dict[str, Any], config: ScaleBenchConfig) -> None:
    rows, trained = results["meshes"], config.compile_only == "no"
    if trained:
        title = (f"{results['recipe']} on meshes of {DEVICES} virtual CPU devices ({results['device']}), batch "
                 f"{results['batch_size']}, K={results['steps_per_call']}, {results['steps_per_epoch']} steps × "
                 f"{results['timed_epochs']} timed epochs (+1 warm-up), jax {results['jax_version']}")
    else:
        m = results["model"]
        title = (f"char-gpt step at the {config.compile_only} shape ({m['params']:,} parameters), compiled only on "
                 f"{config.devices} virtual CPU devices, {results['batch_per_device']} × {m['block_size']} tokens per "
                 f"device, K={results['steps_per_call']}, jax {results['jax_version']}")
    table = Table(title=title)
    columns = ["mesh", "devices", "param+opt MiB/dev", "peak MiB/dev", *(["ms/step"] if trained else []),
               "coll. MiB/step (S)", "sent MiB/dev/step", *(["Δ params", "Δ loss"] if trained else [])]
    for column in columns:
        table.add_column(column, justify="left" if column == "mesh" else "right")
    for r in rows:
        memory = r["memory"]
        cells = [r["mesh"], str(r["devices"]), _mib(r["state_bytes"]), _mib(memory["peak"]) if memory else "n/a"]
        if trained:
            cells.append(f"{r['ms_per_step']:.2f}")
        cells += [_mib(r["collectives"]["bytes"]), _mib(r["collectives"]["sent"])]
        if trained:
            cells += [f"{r['max_param_rel_diff']:.1e}", f"{r['max_loss_rel_diff']:.1e}"]
        table.add_row(*cells)
    console.print(table)

    kinds = Table(title="collectives per step by kind (executions per step: their MiB in all, S)")
    kinds.add_column("mesh")
    for kind in KINDS:
        kinds.add_column(kind, justify="right")
    for r in rows:
        cells = []
        for kind in KINDS:
            k = r["collectives"]["kinds"][kind]
            cells.append(f"{k['count']:g}: {_mib(k['bytes'])}" if k["count"] else "—")
        kinds.add_row(r["mesh"], *cells)
    console.print(kinds)

    param_mib = f"{_mib(results['param_bytes'])} MiB of parameters in all"
    console.print("param+opt: bytes of parameters + optimizer state on device 0, "
                  + ("read from the trained arrays' shards (sharding.shard_bytes)" if trained else
                     "from the layout's rule (sharding.state_bytes_per_device; abstract shapes, no arrays)")
                  + f"; {param_mib}.")
    console.print("peak: the compiled K-step call's memory_analysis(), argument + output + temp - alias "
                  "(the donated state counted once)"
                  + (f"; the arguments include the training set held on each device "
                     f"({_mib(rows[0]['data_bytes'])} MiB on data=1)." if trained else "."))
    console.print("coll.: collectives parsed from the compiled K-step call's HLO, each execution counted at S "
                  "bytes (the whole array: all-reduce result, all-gather result, reduce-scatter operand, "
                  "all-to-all operands), while-loop bodies × their trip count, divided by K; sent: what each "
                  "device sends with ring algorithms (2(n-1)/n·S all-reduce, (n-1)/n·S the others).")
    if trained:
        console.print("Δ: largest relative L2 difference of a parameter array, and largest relative difference of "
                      "an epoch's train or val loss, from data=1 (float32 rounding differs between meshes, and "
                      "training can amplify it over steps: see docs/benchmarks.md).")
        console.print("[bold]Step times are not scaling figures:[/bold] the 4 virtual devices are threads of one "
                      f"process sharing this machine's {os.cpu_count()} cores. A mesh can at most put idle cores to "
                      f"work (at most {os.cpu_count()}x, whatever the number of devices) and adds partitioning and "
                      "collective overhead; read them as the cost of the partitioned program on CPU, nothing about "
                      "GPUs.")
    ratio = _fsdp_ratio(rows)
    if ratio is not None:
        met = "met" if ratio <= FSDP_TARGET else "MISSED"
        console.print(f"FSDP (fsdp=4) / DP (data=4) per-device param+opt bytes: {ratio:.3f} "
                      f"(target <= {FSDP_TARGET}: {met})")


def main(config: ScaleBenchConfig) -> int:
    from jaxtrain._src.errors import ConfigError

    if config.quick:
        config = dataclasses.replace(config, steps=8, steps_per_call=4, repeats=1, text_chars=20_000,
                                     batch_per_device=1)
    if min(config.steps, config.steps_per_call, config.repeats, config.batch_per_device) < 1:
        raise ConfigError("--steps, --steps-per-call, --repeats and --batch-per-device must be >= 1")
    if config.steps % config.steps_per_call:
        raise ConfigError(f"--steps {config.steps} must be a multiple of --steps-per-call {config.steps_per_call}")
    if config.compile_only == "no":
        config = dataclasses.replace(config, devices=DEVICES)
    elif config.devices < 2 or config.devices % 2:
        raise ConfigError(f"--devices {config.devices} must be an even number >= 2")
    meshes = MESHES if config.compile_only == "no" else compile_meshes(config.devices)
    payload = {**dataclasses.asdict(config), "meshes": list(meshes)}
    console = Console(highlight=False)
    if not console.is_terminal:  # files and pipes: wide enough for the table, not rich's 80 columns
        console = Console(highlight=False, width=160)
    what = config.recipe if config.compile_only == "no" else f"char-gpt, {config.compile_only} shape, compile only"
    console.print(f"scale benchmark: {what}; meshes {', '.join(meshes)} in one child process with {config.devices} "
                  "virtual CPU devices")
    t0 = time.perf_counter()
    results = run_child("benchmarks.scale", payload, env=_devices_env(config.devices))
    if "error" in results:
        console.print(f"[red]the benchmark child failed: {results['error']}[/red]")
        return 1
    _print(console, results, config)
    console.print(f"({time.perf_counter() - t0:.0f} s in all, child process included)")
    results["fsdp_over_dp_state_bytes"] = _fsdp_ratio(results["meshes"])
    results["fsdp_target"] = FSDP_TARGET
    results["config"] = dataclasses.asdict(config)
    if config.out:
        Path(config.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    child_main(_child)
