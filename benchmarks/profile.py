"""`jaxtrain bench profile`: where a training step's time goes, op family by op family, jaxtrain vs PyTorch.

JAX side: the workload's compiled K-step call exactly as `fit` runs it (K steps fused in `lax.scan`,
batches gathered inside the call, state donated): `fit` trains `warmup + steps / K` calls and a hook
records a `jax.profiler` trace of the last `steps / K` of them. XLA:CPU (jaxlib 0.10) writes one
Chrome-trace event per executed HLO instruction (thunk) with its `hlo_op` name; each is classified by
its instruction in the compiled HLO (`compiled.as_text()`, saved beside the trace): its opcode and what a
fusion contains, except that the source frames of the op decide for attention (`models/attention.py`),
convolution (`models/cnn.py`'s im2col `conv2d_same` and bias) and optimizer (`optax`, `optim.py`), so
that those compare with torch's fused kernels. "runtime gaps" is the time inside the call's span when
no op ran (loop control, thunk scheduling, and, on a shared machine, being descheduled). Ops can run
on two executor threads at once, so the op rows may add up to more than the span.

PyTorch side (char-gpt and mnist-cnn; `torch_models`): the same model from the same initial weights,
batch, optimizer (fused AdamW/Adam) and clipping as `jaxtrain bench frameworks`, one eager step at a
time (torch.compile with `--torch-compile`), under `torch.profiler`: self CPU time per aten op, grouped
into the same categories (fills count with copies, as XLA's materialised broadcasts do); ops under the
SDPA kernel count as attention, ops under the clip + optimizer step as optimizer. "runtime gaps" is
the self time of the autograd engine's wrappers and allocations, and the step's wall time not inside
any op (Python).

Both tables are per training step, from the traced steps; the step times also measured without a
profiler are shown beside them.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

from benchmarks.child import child_main, run_child, torch_available
from jaxtrain._src.errors import ConfigError

WORKLOADS = ("char-gpt", "mnist-cnn", "mlp-regression")
TORCH_WORKLOADS = ("char-gpt", "mnist-cnn")  # the models ported in torch_models
CATEGORIES = ("matmul", "convolution", "attention", "elementwise", "reduce", "copy/transpose", "gather/scatter",
              "dynamic-slice/update", "custom-call", "optimizer", "control/scalar", "runtime gaps", "other")
QUICK_DATA = {"char-gpt": {"limit": 20_000, "eval_batches": 1}, "mnist-cnn": {"limit": 1536},
              "mlp-regression": {"samples": 2000, "val_samples": 0}}
OPTIMIZER_SCOPE = "jaxtrain.optimizer"  # torch.profiler range around clipping + optimizer.step


@dataclasses.dataclass(frozen=True)
class ProfileBenchConfig:
    """Settings of the per-op profile benchmark."""

    workload: Literal["char-gpt", "mnist-cnn", "mlp-regression"] = "char-gpt"
    """char-gpt (baby preset), mnist-cnn or mlp-regression (no PyTorch port: JAX side only)."""
    steps: int = 16
    """Training steps profiled after warm-up (a multiple of --steps-per-call)."""
    steps_per_call: int = 8
    """K, steps per compiled jaxtrain call (fixed, so that every traced call is the same program)."""
    warmup: int = 3
    """Untraced jaxtrain calls first (the first is not timed); PyTorch runs warmup x K untraced steps."""
    top: int = 20
    """Rows of each per-op table (the rest are summed in one row)."""
    torch: bool = True
    """Also profile the PyTorch eager step (skipped with a note when torch is not installed)."""
    torch_compile: bool = False
    """Profile the torch.compile step too (compiling takes minutes on a small CPU)."""
    out: str = ""
    """Directory for results.json and profile.png (default runs/bench-profile-WORKLOAD)."""
    quick: bool = False
    """A cut-down run for smoke tests: 2 steps in calls of 2, 2 warm-up calls, a slice of the data."""

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ConfigError(f"workload={self.workload!r}: choose one of {', '.join(WORKLOADS)}")
        for field, least in (("steps", 1), ("steps_per_call", 1), ("warmup", 2), ("top", 1)):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < least:
                raise ConfigError(f"{field}={getattr(self, field)!r} must be an integer >= {least}")
        if self.steps % self.steps_per_call:
            raise ConfigError(f"steps={self.steps} must be a multiple of steps_per_call={self.steps_per_call}")


# --- the compiled HLO: what each instruction is ------------------------------------------------------------

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[^\s=]+) = (?P<shape>.*?) (?P<opcode>[a-z][\w\-]*)\((?P<rest>.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?(?P<name>[^\s(]+) \(.*\{$")
_CONTROL = {"while", "conditional", "call", "tuple", "get-tuple-element", "parameter", "constant", "after-all",
            "bitcast", "partition-id", "replica-id", "add-dependency", "opt-barrier"}
_MOVES = {"copy", "transpose", "slice", "concatenate", "pad", "reshape", "broadcast", "iota", "reverse", "bitcast",
          "parameter", "constant", "tuple", "get-tuple-element"}
_REDUCES = {"reduce", "reduce-window", "select-and-scatter", "reduce-precision"}


@dataclasses.dataclass(frozen=True)
class HloOp:
    """One instruction of the compiled module: its opcode, category, and the JAX op it came from."""

    opcode: str
    category: str
    source: str  # metadata op_name (less jit(...)/, while/body/, cond branches) @ its innermost source frame
    transposes: bool  # a fusion that writes or reads through a transpose / layout-changing copy


def _frames(text: str) -> dict[int, tuple[str, set[str]]]:
    """stack_frame_id -> (`function (file:line)` of the innermost frame, `path:qualified function` of that
    frame and all its callers), from the module's frame tables."""
    sections: dict[str, dict[int, str]] = {}
    current = None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current, sections[line] = line, {}
        elif current and (m := re.match(r"^(\d+) (.*)$", line)):
            sections[current][int(m.group(1))] = m.group(2)
        elif current and (not line.strip() or line.startswith("%") or line.startswith("ENTRY")):
            current = None
    files = {i: v.strip('"') for i, v in sections.get("FileNames", {}).items()}
    functions = {i: v.strip('"') for i, v in sections.get("FunctionNames", {}).items()}
    locations = {}  # id -> ("path:function", "function (file.py:line)")
    for i, v in sections.get("FileLocations", {}).items():
        fields = dict(re.findall(r"(\w+)=(\d+)", v))
        path = files.get(int(fields.get("file_name_id", 0)), "")
        function = functions.get(int(fields.get("function_name_id", 0)), "?")
        locations[i] = (f"{path}:{function}",
                        f"{function.rsplit('.', 1)[-1]} ({Path(path).name}:{fields.get('line', '?')})")
    frames = {}
    for i, v in sections.get("StackFrames", {}).items():
        fields = dict(re.findall(r"(\w+)=(\d+)", v))
        frames[i] = (int(fields.get("file_location_id", 0)), int(fields.get("parent_frame_id", i)))
    chains = {}
    for i in frames:
        seen, j, chain = set(), i, set()
        while j in frames and j not in seen:
            seen.add(j)
            chain.add(locations.get(frames[j][0], ("", ""))[0])
            j = frames[j][1]
        chains[i] = (locations.get(frames[i][0], ("", ""))[1], chain)
    return chains


SCOPES = (  # (category, pattern on `path:function` of a frame); an op whose frames match one counts there
    ("attention", r"jaxtrain/models/attention\.py:"),  # as torch's fused SDPA kernel
    ("convolution", r"jaxtrain/models/cnn\.py:(conv2d_same|Conv2D\.__call__)$"),  # im2col, matmul and bias
    ("optimizer", r"/optax/(_src|transforms|schedules|tree_utils)/|jaxtrain/optim\.py:"),
)


def _scope(frames: set[str]) -> str | None:
    """The category an op's source frames put it in (see SCOPES), else None; the loss is never optimizer."""
    for category, pattern in SCOPES:
        if any(re.search(pattern, f) for f in frames):
            if category == "optimizer" and any("/optax/losses/" in f for f in frames):
                continue
            return category
    return None


def _family(opcodes: set[str], custom_targets: set[str], scalar: bool) -> str:
    """The op family of an instruction, or of a fusion from the opcodes it contains."""
    if "convolution" in opcodes or any("conv" in t for t in custom_targets):
        return "convolution"
    if "dot" in opcodes or any(("matmul" in t or "gemm" in t) for t in custom_targets):
        return "matmul"
    if "custom-call" in opcodes:
        return "custom-call"
    if opcodes & {"gather", "scatter"}:
        return "gather/scatter"
    if opcodes & {"dynamic-slice", "dynamic-update-slice"}:
        return "dynamic-slice/update"
    if opcodes & _REDUCES:
        return "reduce"
    if opcodes <= _CONTROL:
        return "control/scalar"
    if opcodes <= _MOVES:
        return "copy/transpose"
    if opcodes & {"sort", "rng", "rng-bit-generator", "rng-get-and-update-state"}:
        return "other"
    return "control/scalar" if scalar else "elementwise"


def hlo_ops(text: str) -> tuple[str, dict[str, HloOp]]:
    """(module name, instruction name -> `HloOp`) of a compiled module's text (`compiled.as_text()`)."""
    module = re.match(r"HloModule (\S+?),?\s", text)
    computations: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
    current = ""
    for line in text.splitlines():
        if m := _COMPUTATION.match(line):
            current = m.group("name")
        elif m := _INSTRUCTION.match(line):
            computations[current].append((m.group("name"), m.group("shape"), m.group("opcode"), m.group("rest")))
    chains = _frames(text)
    shapes = {c: {name: shape for name, shape, _, _ in instructions} for c, instructions in computations.items()}

    def contents(computation: str, seen: frozenset = frozenset()) -> tuple[set[str], set[str], bool]:
        """Opcodes and custom-call targets inside `computation` (nested calls included); whether it transposes."""
        opcodes, targets, transposes = set(), set(), False
        for _, shape, opcode, rest in computations.get(computation, []):
            opcodes.add(opcode)
            if opcode == "custom-call" and (t := re.search(r'custom_call_target="([^"]+)"', rest)):
                targets.add(t.group(1).lower())
            transposes |= opcode == "transpose" or (opcode == "copy" and _layout_changes(shape, rest,
                                                                                       shapes[computation]))
            for called in re.findall(r"calls=%([^\s,}]+)", rest):
                if called not in seen:
                    o, t, tr = contents(called, seen | {computation})
                    opcodes, targets, transposes = opcodes | o, targets | t, transposes or tr
        return opcodes, targets, transposes

    ops = {}
    for instructions in computations.values():
        for name, shape, opcode, rest in instructions:
            opcodes, targets, transposes = {opcode}, set(), opcode == "transpose"
            if opcode == "custom-call" and (t := re.search(r'custom_call_target="([^"]+)"', rest)):
                targets.add(t.group(1).lower())
            if opcode == "fusion" and (called := re.search(r"calls=%([^\s,}]+)", rest)):
                opcodes, targets, transposes = contents(called.group(1))
            scalar = bool(re.fullmatch(r"\(?[a-z0-9]+\[\](\{\})?\)?", shape.strip()))
            family = _family(opcodes, targets, scalar)
            frame = re.search(r"stack_frame_id=(\d+)", rest)
            where, files = chains.get(int(frame.group(1)), ("", set())) if frame else ("", set())
            scope = _scope(files)
            op_name = re.search(r'op_name="([^"]*)"', rest)
            source = re.sub(r"(jit\([^)]*\)|while/body|closed_call|cond/branch_\d+_fun)/", "",
                            op_name.group(1)) if op_name else ""
            source = f"{source} @ {where}" if where else source
            category = scope or family
            ops[name] = HloOp(opcode, category, source, transposes)
    return (module.group(1) if module else ""), ops


def _layout_changes(shape: str, rest: str, shapes: dict[str, str]) -> bool:
    """Whether a copy changes the layout (its operand's {minor-to-major} differs from its own)."""
    operand = re.match(r"%([^\s,)]+)", rest)
    if not operand:
        return False
    layout = re.search(r"\{[\d,]*\}", shape)
    other = re.search(r"\{[\d,]*\}", shapes.get(operand.group(1), ""))
    return bool(layout and other and layout.group(0) != other.group(0))


# --- the JAX trace: one event per executed instruction -------------------------------------------------------

def _busy(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of `(start, end)` intervals as sorted, disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _shares(intervals: list[tuple[float, float]]) -> list[float]:
    """Wall time of each interval, each moment split equally among the intervals running then: the
    shares add up to the union's length, so ops that overlapped are not counted twice."""
    boundaries = sorted({t for interval in intervals for t in interval})
    if len(boundaries) < 2:
        return [0.0] * len(intervals)
    index = {t: i for i, t in enumerate(boundaries)}
    active = [0] * len(boundaries)  # ops running in [boundaries[i], boundaries[i + 1])
    for s, e in intervals:
        for i in range(index[s], index[e]):
            active[i] += 1
    return [sum((boundaries[i + 1] - boundaries[i]) / active[i] for i in range(index[s], index[e]))
            for s, e in intervals]


def read_trace(trace_dir: Path) -> list[dict[str, Any]]:
    """The complete ('X') events of the newest `.trace.json.gz` that `jax.profiler` wrote under `trace_dir`."""
    files = sorted(trace_dir.glob("plugins/profile/*/*.trace.json.gz"))
    if not files:
        return []
    with gzip.open(files[-1], "rt") as f:
        return [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]


def _finish_times(events: list[dict[str, Any]], mine: list[dict[str, Any]]) -> dict[int, float]:
    """id(event) -> when the op finished (µs). An asynchronous thunk (a while loop, an Eigen dot) returns
    before its work is done; its completion is a later "end: NAME" event. Executions of one instruction
    never overlap, so each is paired with the first "end:" event of its name before its next execution;
    an op without one finished at the end of its own event."""
    ends = defaultdict(list)
    for e in events:
        if e.get("name", "").startswith("end: "):
            ends[e["name"][5:]].append(e["ts"] + e.get("dur", 0.0))
    starts = defaultdict(list)
    for e in mine:
        starts[e["args"]["hlo_op"]].append(e)
    finish = {}
    for name, executions in starts.items():
        executions.sort(key=lambda e: e["ts"])
        times, j = sorted(ends.get(name, [])), 0
        for k, e in enumerate(executions):
            while j < len(times) and times[j] < e["ts"]:
                j += 1
            following = executions[k + 1]["ts"] if k + 1 < len(executions) else float("inf")
            done = times[j] if j < len(times) and times[j] <= following else None
            j += done is not None
            finish[id(e)] = max(e["ts"] + e["dur"], done if done is not None else 0.0)
    return finish


def jax_op_rows(events: list[dict[str, Any]], module: str, ops: dict[str, HloOp],
                steps_per_call: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-instruction rows (count and ms per step) of the traced executions of `module`, and totals.

    An op runs from its event's start to its completion (`_finish_times`): `op_ms_per_step`. Ops overlap
    (two executor threads; Eigen dots run asynchronously beside other thunks), so `ms_per_step` is each
    op's share of the wall time (a moment shared by n ops counts 1/n to each): the rows add up to the
    calls' span. Control instructions that contain others (while, conditional, call) are not rows: the
    time of a call's span covered by no op is the "runtime gaps" row.
    """
    mine = [e for e in events if (e.get("args") or {}).get("hlo_module") == module and e["args"].get("hlo_op")]
    runs = defaultdict(list)
    for e in mine:
        runs[e["args"].get("run_id")].append(e)
    calls = len(runs)
    steps = calls * steps_per_call
    if not steps:
        return [], {"calls": 0, "steps": 0}
    finish = _finish_times(events, mine)

    def is_leaf(e: dict[str, Any]) -> bool:
        return ops.get(e["args"]["hlo_op"], HloOp("", "", "", False)).opcode not in ("while", "conditional", "call")

    span_us = busy_us = 0.0
    gaps: list[float] = []  # µs between one op's end and the next op's start, inside a call
    by_op: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (wall share, start to finish) in µs
    for es in runs.values():
        leaves = [e for e in es if is_leaf(e)]
        intervals = [(e["ts"], finish[id(e)]) for e in leaves]
        for e, share, (s, f) in zip(leaves, _shares(intervals), intervals):
            by_op[e["args"]["hlo_op"]].append((share, f - s))
        start, end = min(e["ts"] for e in es), max(finish[id(e)] for e in es)
        busy = _busy(intervals)
        span_us += end - start
        busy_us += sum(f - s for s, f in busy)
        edges = [start, *(t for interval in busy for t in interval), end]
        gaps += [b - a for a, b in zip(edges[::2], edges[1::2]) if b > a]
    rows = []
    for name, times in by_op.items():
        op = ops.get(name, HloOp("?", "other", "", False))
        rows.append({"op": name, "category": op.category, "source": op.source, "transposes": op.transposes,
                     "count_per_step": len(times) / steps, "ms_per_step": sum(t[0] for t in times) / steps / 1e3,
                     "op_ms_per_step": sum(t[1] for t in times) / steps / 1e3})
    gaps_ms = max(span_us - busy_us, 0.0) / steps / 1e3
    rows.append({"op": "(runtime gaps)", "category": "runtime gaps", "source": "no op running inside the call",
                 "transposes": False, "count_per_step": 0.0, "ms_per_step": gaps_ms, "op_ms_per_step": gaps_ms})
    rows.sort(key=lambda r: -r["ms_per_step"])
    op_ms = sum(r["op_ms_per_step"] for r in rows) - gaps_ms
    totals = {"calls": calls, "steps": steps, "span_ms_per_step": span_us / steps / 1e3,
              "busy_ms_per_step": busy_us / steps / 1e3, "op_ms_per_step": op_ms,
              "overlap_ms_per_step": op_ms - busy_us / steps / 1e3,
              "ops_per_step": sum(len(t) for t in by_op.values()) / steps,
              "gaps_per_step": len(gaps) / steps, "median_gap_us": statistics.median(gaps) if gaps else 0.0,
              "gap_ms_per_step_over_1ms": sum(g for g in gaps if g > 1e3) / steps / 1e3}
    return rows, totals


# --- the jaxtrain run -----------------------------------------------------------------------------------

def recipe_config(workload: str, config: ProfileBenchConfig) -> tuple[Any, Any]:
    """The recipe and the config `fit` runs: the workload's training settings (char-gpt: the baby preset,
    as `bench frameworks`), one epoch of warmup + steps / K calls of K steps, no checkpoints, no TensorBoard."""
    from jaxtrain.tools.recipes import get_recipe

    recipe = get_recipe(workload)
    base = recipe.presets.get("baby", recipe.config)
    if config.quick:
        base = dataclasses.replace(base, data=dataclasses.replace(base.data, **QUICK_DATA[workload]))
    calls = config.warmup + config.steps // config.steps_per_call
    return recipe, dataclasses.replace(
        base, epochs=1, steps_per_epoch=calls * config.steps_per_call, steps_per_call=config.steps_per_call,
        quiet=True, verbosity="silent", tensorboard=False,
        checkpoint=dataclasses.replace(base.checkpoint, enabled=False))


def _trace_hook(warmup: int, calls: int, trace_dir: Path):
    """A hook that times the warm-up calls one by one and traces the `calls` after them (each waited for)."""
    import jax

    from jaxtrain._src.hooks import RunHook

    class TraceCalls(RunHook):
        def __init__(self) -> None:
            self.n, self.t, self.untraced_s, self.traced_s, self.compiled = 0, 0.0, [], 0.0, None
            self.tracing = False

        def after_call(self, run: Any, k: int, metrics: dict[str, jax.Array]) -> None:
            self.n += 1
            jax.block_until_ready(metrics)
            now = time.perf_counter()
            if 1 < self.n <= warmup:
                self.untraced_s.append((now - self.t) / k)
            if self.n == warmup:
                self.compiled = run.calls.get(k)
                jax.profiler.start_trace(str(trace_dir))
                self.tracing = True
                now = time.perf_counter()
            elif self.n == warmup + calls:
                self.traced_s = (now - self.t) / (calls * k)
                self.stop()
            self.t = now

        def stop(self) -> None:
            if self.tracing:
                jax.profiler.stop_trace()
                self.tracing = False

    return TraceCalls()


def profile_jax(config: ProfileBenchConfig, trace_dir: Path) -> dict[str, Any]:
    """Runs the workload through `fit`, traces `steps / K` calls and returns the per-op rows and totals."""
    from jaxtrain.engine import RunOptions, run

    recipe, rconfig = recipe_config(config.workload, config)
    w = recipe.build(rconfig)
    hook = _trace_hook(config.warmup, config.steps // config.steps_per_call, trace_dir)
    try:
        run(w.model, w.loss_fn, w.train, None, rconfig, hooks=[hook], preprocess=w.preprocess, augment=w.augment,
            verbosity="silent", session=RunOptions(name=recipe.name))
    finally:
        hook.stop()  # a run that failed while tracing leaves no trace open
        w.close()
    text = hook.compiled.as_text()
    (trace_dir / "train_call.hlo.txt").write_text(text)  # the compiled call, to look up an op by name
    module, ops = hlo_ops(text)
    rows, totals = jax_op_rows(read_trace(trace_dir), module, ops, config.steps_per_call)
    result = {"module": module, "rows": rows, "totals": totals, "source": "trace",
              "ms_per_step_untraced": statistics.median(hook.untraced_s) * 1e3,
              "ms_per_step_traced": hook.traced_s * 1e3, "batch_size": rconfig.batch_size,
              "hlo_instructions": len(ops)}
    if not rows:  # no per-op events in this jaxlib's trace: what the compiled program holds, without times
        result.update(source="hlo", rows=_hlo_rows(ops), totals={**totals, "cost_analysis": _cost(hook.compiled)})
    return result


def _hlo_rows(ops: dict[str, HloOp]) -> list[dict[str, Any]]:
    """Fallback rows: instructions per category of the compiled program (times unknown)."""
    counts: dict[str, int] = defaultdict(int)
    for op in ops.values():
        if op.category != "control/scalar":
            counts[op.category] += 1
    return [{"op": f"({n} instructions)", "category": c, "source": "compiled HLO", "transposes": False,
             "count_per_step": float(n), "ms_per_step": 0.0, "op_ms_per_step": 0.0} for c, n in counts.items()]


def _cost(compiled: Any) -> dict[str, float]:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - optional backend feature
        return {}
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {k: float(v) for k, v in (cost or {}).items() if k in ("flops", "bytes accessed", "transcendentals")}


# --- the PyTorch step (run in a child process: `python -m benchmarks.profile --child`) ----------------

_TORCH_CATEGORIES = (  # (category, pattern on the op name), first match wins; scopes are decided before
    ("matmul", r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_mkldnn_matmul|mkldnn_matmul)$"),
    ("convolution", r"conv"),
    ("gather/scatter", r"^aten::(embedding|embedding_dense_backward|embedding_backward|index|index_select|"
                       r"index_put_|_index_put_impl_|gather|scatter|scatter_add_|take|index_add_)$"),
    ("reduce", r"^aten::(sum|mean|max|amax|min|amin|norm|linalg_vector_norm|_softmax|_log_softmax|"
               r"_softmax_backward_data|_log_softmax_backward_data|nll_loss|nll_loss_forward|nll_loss_backward|"
               r"nll_loss2d_forward|native_layer_norm|native_layer_norm_backward|layer_norm|avg_pool2d|"
               r"avg_pool2d_backward|var|std|argmax|cross_entropy_loss|logsumexp)$"),
    ("copy/transpose", r"^aten::(fill_|zero_|zeros|zeros_like|ones|ones_like|full|full_like|new_zeros|copy_|clone|"
                       r"contiguous|transpose|permute|t|view|reshape|_reshape_alias|"
                       r"_unsafe_view|expand|as_strided|split|split_with_sizes|unfold|cat|stack|slice|select|"
                       r"narrow|unsqueeze|squeeze|flatten|detach|detach_|to|_to_copy|alias|unbind|chunk)$"),
    ("runtime gaps", r"^aten::(empty|empty_like|empty_strided|resize_|lift_fresh|set_|result_type|item|"
                     r"_local_scalar_dense|arange|is_nonzero|scalar_tensor|new_empty|new_empty_strided)$"),
)


def torch_category(name: str, ancestors: list[str]) -> str:
    """The category of a torch op from its name and the names of the ranges it ran inside."""
    if any(re.search(r"scaled_dot_product|flash_attention|ScaledDotProduct", a) for a in [name, *ancestors]):
        return "attention"
    if OPTIMIZER_SCOPE in (name, *ancestors) or re.search(r"_fused_adam|_foreach_", name):
        return "optimizer"
    if "cpp_fused" in name:  # a torch.compile (inductor) kernel
        return "reduce" if re.search(r"sum|mean|max|softmax|norm|avg_pool|nll|var", name) else "elementwise"
    for category, pattern in _TORCH_CATEGORIES:
        if re.search(pattern, name):
            return category
    return "elementwise" if name.startswith("aten::") else "runtime gaps"


def torch_profile(spec_path: str, variant: str, warmup: int, steps: int) -> dict[str, Any]:
    """Profiles `steps` PyTorch training steps of the prepared workload after `warmup` untraced ones:
    per-op self CPU ms and counts per step, and the untraced and traced ms per step."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from benchmarks.torch_models import (
        TASKS,
        build_torch_optimizer,
        forward_check,
        load_jax_params,
        train_step,
    )

    torch.set_num_threads(os.cpu_count() or 1)
    spec = json.loads(Path(spec_path).read_text())
    arrays = np.load(spec["arrays"])
    task = TASKS[spec["workload"]](spec, arrays)
    load_jax_params(task.model, {k.removeprefix("params/"): arrays[k] for k in arrays.files if k.startswith("params/")})
    check = forward_check(task, arrays["check_input"], arrays["check_logits"])
    optimizer = build_torch_optimizer(task.model, spec["optim"])
    parameters, clip = list(task.model.parameters()), spec["optim"]["clip_norm"]
    rows, lrs = torch.from_numpy(arrays["rows"]), arrays["lr"].tolist()
    loss_fn = task.loss
    if variant == "torch-compile":
        import torch._inductor.config as inductor

        inductor.cpp.enable_kernel_profile = True  # inductor's kernels appear in the profile by name
        loss_fn = torch.compile(task.loss, dynamic=False)
    task.model.train()

    def step(i: int) -> None:  # torch_models.train's step, its clip and update labelled for the profile
        train_step(task, loss_fn, optimizer, parameters, rows[i], lrs[i], clip,
                   lambda: record_function(OPTIMIZER_SCOPE))

    times = []
    for i in range(warmup):
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for i in range(warmup, warmup + steps):
            step(i)
        traced_s = time.perf_counter() - t0
    by_op: dict[tuple[str, str], list[float]] = defaultdict(list)
    for event in prof.events():
        ancestors, parent = [], event.cpu_parent
        while parent is not None:
            ancestors.append(parent.name)
            parent = parent.cpu_parent
        by_op[(event.name, torch_category(event.name, ancestors))].append(event.self_cpu_time_total)
    op_rows = [{"op": name, "category": category, "count_per_step": len(us) / steps,
                "ms_per_step": sum(us) / steps / 1e3} for (name, category), us in by_op.items()]
    op_ms = sum(r["ms_per_step"] for r in op_rows)
    op_rows.append({"op": "(outside any op)", "category": "runtime gaps", "count_per_step": 0.0,
                    "ms_per_step": max(traced_s / steps * 1e3 - op_ms, 0.0)})
    op_rows.sort(key=lambda r: -r["ms_per_step"])
    later = times[len(times) // 2:]  # the first steps allocate (and with torch.compile, compile)
    return {"variant": variant, "rows": op_rows, "ms_per_step_untraced": statistics.median(later) * 1e3,
            "ms_per_step_traced": traced_s / steps * 1e3, "forward_check": check, "threads": torch.get_num_threads(),
            "torch_version": torch.__version__}


def _torch_runs(config: ProfileBenchConfig, console: Any) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Profiles the PyTorch variants in child processes; (variant -> result, notes on what was skipped)."""
    from benchmarks.frameworks import FrameworksConfig, prepare

    variants = ["torch-eager"] + (["torch-compile"] if config.torch_compile else [])
    if not config.torch:
        return {}, ["PyTorch side not run (--no-torch)"]
    if config.workload not in TORCH_WORKLOADS:
        return {}, [f"PyTorch side skipped: torch_models has no port of {config.workload} "
                    f"(ported: {', '.join(TORCH_WORKLOADS)})"]
    if not torch_available():
        return {}, ["PyTorch side skipped: torch is not installed (pip install 'jaxtrain[bench]', or torch==2.13.0 "
                    "on CPU)"]
    warmup = config.warmup * config.steps_per_call
    results, notes = {}, []
    with tempfile.TemporaryDirectory(prefix="jaxtrain-profile-") as tmp:
        prepared = prepare(config.workload, FrameworksConfig(workloads=config.workload, variants="jaxtrain",
                                                             steps=warmup + config.steps), Path(tmp))
        for variant in variants:
            console.print(f"profiling PyTorch ({variant}): {warmup} warm-up steps, then {config.steps} profiled ...")
            r = run_child("benchmarks.profile", {"spec_path": str(prepared.spec_path), "variant": variant,
                                                      "warmup": warmup, "steps": config.steps})
            if "error" in r:
                notes.append(f"{variant} FAILED: {r['error']}")
                continue
            results[variant] = r
            if not r["forward_check"]["passed"]:  # the two models should start from the same function
                notes.append(f"{variant}: forward check FAILED: logits differ from JAX's by "
                             f"{r['forward_check']['max_rel_diff']:.1e} (relative)")
    return results, notes


# --- tables -----------------------------------------------------------------------------------------------

def by_category(rows: list[dict[str, Any]]) -> dict[str, float]:
    """ms per step summed per category, in CATEGORIES order (categories with no time left out)."""
    totals = defaultdict(float)
    for r in rows:
        totals[r["category"]] += r["ms_per_step"]
    return {c: totals[c] for c in CATEGORIES if totals.get(c, 0.0) > 0}


def _top(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    rest = rows[n:]
    if not rest:
        return rows[:n]
    return rows[:n] + [{"op": f"({len(rest)} other ops)", "category": "", "source": "", "transposes": False,
                        "count_per_step": sum(r["count_per_step"] for r in rest),
                        "ms_per_step": sum(r["ms_per_step"] for r in rest),
                        "op_ms_per_step": sum(r.get("op_ms_per_step", 0.0) for r in rest)}]


def comparison(jax_rows: list[dict[str, Any]], torch_rows: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Per category: JAX and torch ms per step, their ratio and difference."""
    j, t = by_category(jax_rows), by_category(torch_rows or [])
    out = []
    for c in CATEGORIES:
        if c in j or c in t:
            jm, tm = j.get(c, 0.0), (t.get(c, 0.0) if torch_rows is not None else None)
            out.append({"category": c, "jax_ms": jm, "torch_ms": tm,
                        "ratio": jm / tm if tm else None, "diff_ms": jm - tm if tm is not None else None})
    return out


def main(config: ProfileBenchConfig) -> int:
    import jax
    from rich.console import Console
    from rich.table import Table

    from jaxtrain._src.report import device_description

    if config.quick:
        config = dataclasses.replace(config, steps=2, steps_per_call=2, warmup=2, torch_compile=False)
    out = Path(config.out or f"runs/bench-profile-{config.workload}")
    out.mkdir(parents=True, exist_ok=True)
    console = Console(highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    device = device_description(jax.devices()[0])
    console.print(f"profile of one training step, {config.workload}: jaxtrain's compiled call of "
                  f"K={config.steps_per_call} steps in lax.scan (as fit runs it), {config.warmup} warm-up calls, "
                  f"then {config.steps} steps traced; {device}, jax {jax.__version__}")
    trace_dir = out / "jax-trace"
    load = {"start": os.getloadavg()[0]}  # other work on the cores shows here (torch's threads suffer most)
    jx = profile_jax(config, trace_dir)
    load["after_jax"] = os.getloadavg()[0]
    torch_results, notes = _torch_runs(config, console)
    load["end"] = os.getloadavg()[0]
    if jx["source"] == "hlo":
        notes.insert(0, "this jaxlib's trace has no per-op events: the JAX table counts the compiled HLO's "
                        "instructions per category (no times); XLA's cost analysis is in results.json")

    t = jx["totals"]
    table = Table(title=f"jaxtrain {config.workload}: per HLO op, ms per training step ({t['steps']} traced steps; "
                        f"span {t.get('span_ms_per_step', 0):.2f} ms/step traced, "
                        f"{jx['ms_per_step_untraced']:.2f} untraced)")
    for column in ("op", "category", "JAX op @ source", "count/step", "ms/step", "start→end ms", "share"):
        table.add_column(column, justify="left" if column in ("op", "category", "JAX op @ source") else "right")
    total = sum(r["ms_per_step"] for r in jx["rows"]) or 1.0
    for r in _top(jx["rows"], config.top):
        category = r["category"] + (" (+transpose)" if r["transposes"] else "")
        table.add_row(r["op"], category, r["source"][-70:], f"{r['count_per_step']:.2f}", f"{r['ms_per_step']:.3f}",
                      f"{r['op_ms_per_step']:.3f}", f"{r['ms_per_step'] / total:.1%}")
    console.print(table)

    for variant, r in torch_results.items():
        table = Table(title=f"PyTorch {variant} {config.workload}: per aten op, self CPU ms per training step "
                            f"({config.steps} profiled steps; {r['ms_per_step_traced']:.2f} ms/step profiled, "
                            f"{r['ms_per_step_untraced']:.2f} unprofiled)")
        for column in ("op", "category", "count/step", "ms/step", "share"):
            table.add_column(column, justify="right" if column in ("count/step", "ms/step", "share") else "left")
        total_t = sum(x["ms_per_step"] for x in r["rows"]) or 1.0
        for x in _top(r["rows"], config.top):
            table.add_row(x["op"], x["category"], f"{x['count_per_step']:.2f}", f"{x['ms_per_step']:.3f}",
                          f"{x['ms_per_step'] / total_t:.1%}")
        console.print(table)

    comparisons = {v: comparison(jx["rows"], r["rows"]) for v, r in torch_results.items()} or \
        {"none": comparison(jx["rows"], None)}
    for variant, rows in comparisons.items():
        against = "PyTorch " + variant if variant != "none" else "(no PyTorch run)"
        table = Table(title=f"{config.workload}: ms per training step by category, jaxtrain vs {against}")
        for column in ("category", "jaxtrain ms", "torch ms", "jaxtrain / torch", "jaxtrain - torch ms"):
            table.add_column(column, justify="left" if column == "category" else "right")
        for c in rows:
            table.add_row(c["category"], f"{c['jax_ms']:.2f}", "-" if c["torch_ms"] is None else f"{c['torch_ms']:.2f}",
                          "-" if c["ratio"] is None else f"{c['ratio']:.2f}x",
                          "-" if c["diff_ms"] is None else f"{c['diff_ms']:+.2f}")
        jt = sum(c["jax_ms"] for c in rows)
        tt = sum(c["torch_ms"] or 0.0 for c in rows) if variant != "none" else None
        table.add_section()
        table.add_row("total (rows)", f"{jt:.2f}", "-" if tt is None else f"{tt:.2f}",
                      "-" if not tt else f"{jt / tt:.2f}x", "-" if tt is None else f"{jt - tt:+.2f}")
        console.print(table)

    transposing = sum(r["ms_per_step"] for r in jx["rows"] if r["transposes"])
    if jx["source"] == "trace":
        notes += [
            f"jaxtrain: {t['ops_per_step']:.0f} op executions per step; some op ran during {t['busy_ms_per_step']:.2f} "
            f"ms of the {t['span_ms_per_step']:.2f} ms/step span. ms/step is each op's share of the wall time (a "
            f"moment when n ops ran counts 1/n to each); start→end is its own duration: those add up to "
            f"{t['op_ms_per_step']:.2f} ms/step, as ops overlap (two executor threads, Eigen dots asynchronous). "
            f"{transposing:.2f} ms/step (wall share) is in fusions that also transpose (marked +transpose).",
            f"jaxtrain runtime gaps: {t['gaps_per_step']:.0f} per step, median {t['median_gap_us']:.1f} µs; "
            f"{t['gap_ms_per_step_over_1ms']:.2f} ms/step of them in gaps over 1 ms (the thread descheduled, "
            "or waiting on the other thread).",
            "jaxtrain categories: by instruction (a fusion by what it contains: a dot makes it matmul, a reduce "
            "reduce; broadcasts and fills are copy/transpose); attention, convolution and optimizer by the op's "
            "source frames (models/attention.py; cnn.py's conv2d_same and Conv2D; optax, optim.py), to compare "
            "with torch's fused SDPA, oneDNN convolution and fused Adam kernels.",
        ]
    notes.append(f"times are from one run on a machine that may be shared (1-minute load average {load['start']:.2f} "
                 f"at the start, {load['after_jax']:.2f} after the JAX side, {load['end']:.2f} at the end; "
                 f"{os.cpu_count()} cores): treat differences under ~15% as noise, and a PyTorch step far slower "
                 "than `bench frameworks` measures as other work on the cores.")
    for note in notes:
        console.print(note)
    payload = {"config": dataclasses.asdict(config), "device": device, "jax_version": jax.__version__,
               "cpu_count": os.cpu_count(), "load_average": load, "jax": jx, "torch": torch_results,
               "comparison": comparisons,
               "notes": notes}
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    _chart(comparisons, config.workload, out / "profile.png")
    console.print(f"wrote {out / 'results.json'}, {out / 'profile.png'}, and the JAX trace under {trace_dir} "
                  "(Perfetto, TensorBoard)")
    return 0


def _chart(comparisons: dict[str, list[dict[str, Any]]], workload: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = next(iter(comparisons.values()))
    series = {"jaxtrain": [c["jax_ms"] for c in rows]}
    for variant, cs in comparisons.items():
        if variant != "none":
            series[variant] = [c["torch_ms"] or 0.0 for c in cs]
    x = np.arange(len(rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + i * width, values, width, label=name)
    ax.set_xticks(x + width * (len(series) - 1) / 2, [c["category"] for c in rows], rotation=30, ha="right")
    ax.set_ylabel("ms per training step")
    ax.set_title(f"{workload}: time per step by op category")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    child_main(lambda payload: torch_profile(**payload))
