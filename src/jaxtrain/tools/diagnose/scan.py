"""Static analysis of JAX training code for the anti-patterns of the case study (`jaxtrain scan`).

The code is parsed with `ast`, never imported or run. Each rule is a `Rule` (what, why, fix, gain,
confidence, severity) in `RULES` and one check function that walks a parsed module and yields
`Finding`s. The checks share one `_Module`: import aliases, name bindings per scope, which
functions run under `jit`, which calls are training steps and which loops call them.

The heuristics lean towards silence: a function that is returned, passed to another call or
assigned to a name may be jitted elsewhere, so its gradients and updates count as compiled.
A line ending in `# jaxtrain: ignore` (all rules) or `# jaxtrain: ignore[rule-id, ...]` is skipped.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal, Sequence

from jaxtrain import ConfigError

Severity = Literal["high", "medium", "low"]
SEVERITIES: tuple[Severity, ...] = ("high", "medium", "low")
FAIL_ON = ("high", "medium", "low", "never")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One anti-pattern.

    Attributes:
      id: the rule's name in reports and `# jaxtrain: ignore[...]` comments.
      severity: the default severity; a finding may be lower (e.g. an update already under jit).
      message: what the pattern is, in a few words.
      why: why it is slow (or costs memory).
      fix: what to write instead, and the jaxtrain option or feature that does it.
      gain: the expected gain of the fix.
      confidence: how sure the check is that a match is the anti-pattern (high / medium / low).
    """

    id: str
    severity: Severity
    message: str
    why: str
    fix: str
    gain: str
    confidence: str


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("unjitted-grad", "high", "gradient step runs outside jit",
         "Every call traces the loss and its gradient op by op: each op is a separate dispatch (~18 us on "
         "CPU) and nothing is fused; an un-jitted jax.grad of the case study's MLP costs ~15 ms a step.",
         "Put loss, gradient and update in one function and jit it once (`@jax.jit`, state donated); "
         "`jaxtrain.fit(model, loss_fn, data, config=TrainConfig(...))` compiles the whole step for you.",
         "5-10x per step (7.2x on the ladder, variant 0 -> 1)", "high"),
    Rule("jit-in-loop", "high", "jit applied inside a loop",
         "A lambda, partial or function defined in the loop is a new object every iteration: jit traces and "
         "compiles it again each time (tens of ms). Even for a fixed function, calling `jax.jit(f)` anew skips "
         "the fast dispatch path (~3x the cost of a call).",
         "Apply jit once, outside the loop, to a function defined once; pass what changes as arguments "
         "(`static_argnums` for Python values). `jaxtrain.fit` compiles each call once, ahead of time.",
         "10-1000x per step when it recompiles; ~3x dispatch otherwise", "high"),
    Rule("row-loop", "high", "Python loop over the rows of a batch",
         "One model/loss call per sample: B dispatches (or, under jit, B unrolled copies of the model that "
         "compile slowly) where one batched call does the same work.",
         "Write the per-sample function once and `jax.vmap` it over the batch (or write it batched); "
         "jaxtrain's models and `loss_fn(model, batch, key)` take whole batches.",
         "~B x fewer dispatches: 10-100x per step", "medium"),
    Rule("per-batch-transfer", "medium", "host-to-device copy of each batch",
         "`jnp.array`/`jnp.asarray`/`jax.device_put` of a host batch every step waits for a copy (and the "
         "NumPy work before it) on the critical path; the device idles meanwhile.",
         "Put the dataset on the device once and gather each batch inside the compiled step: `jaxtrain.fit` "
         "does so by default (--data.placement auto); data too big for the device stream with the copy "
         "overlapped, >= 2 batches ahead.",
         "1.1-1.5x per step (1.12x on the ladder's CPU run, variant 1 -> 2); more on GPU", "medium"),
    Rule("numpy-in-loop", "medium", "NumPy preprocessing of each batch",
         "NumPy runs on the host, one op at a time, between device steps: the step cannot start until it is "
         "done and its result copied over.",
         "Do the preprocessing in JAX inside the compiled step: `jaxtrain.fit(..., preprocess="
         "jaxtrain.data.normalize(...), augment=jaxtrain.data.gaussian_noise(...))` traces it into the step, "
         "with randomness from keys.",
         "1.1-1.5x per step; more on GPU, where the device waits for the host", "medium"),
    Rule("host-sync", "medium", "device value read back on the host every step",
         "`float()`, `.item()`, `np.asarray()` or printing a device value blocks until the step is done "
         "(~30 us each on CPU, a pipeline stall on GPU): the next step cannot be dispatched ahead.",
         "Keep metrics on the device; read them every N steps (`if step % N == 0`) or once per epoch. "
         "`jaxtrain.fit` reads metrics once per call of K steps (--log-every for the progress line).",
         "1.1-2x per step for small models; more on GPU", "medium"),
    Rule("manual-update", "medium", "hand-written parameter update",
         "Outside jit, `p - lr * g` is two eager dispatches per parameter array; inside jit it is as fast "
         "as optax, but momentum, Adam, weight decay, clipping and schedules are each more code to get right.",
         "Use optax in the jitted step (`tx = optax.sgd(lr)`; `updates, opt_state = tx.update(grads, "
         "opt_state, params)`; `optax.apply_updates`); jaxtrain builds the chain from --optim.name, "
         "--optim.lr, --optim.schedule, --optim.clip-norm, or takes yours: `fit(..., optimizer=tx)`.",
         "1.1-2x per step outside jit; the same speed inside jit (severity low there)", "medium"),
    Rule("conv-in-scan", "medium", "convolution inside a lax.scan / fori_loop / while_loop body",
         "XLA:CPU runs `lax.conv_general_dilated` (what `nnx.Conv`, `nn.Conv` and `eqx.nn.Conv2d` call) about "
         "9-14x slower inside a loop body than in a plain jitted step (jax-ml/jax#12868): Keras's MNIST convnet in "
         "Flax NNX took 81 ms a step jitted alone, 1168 ms a step in a rolled `lax.scan` of 8, 62 ms fully "
         "unrolled. GPUs do not have the problem.",
         "On CPU, call the plain jitted step from Python (or `jaxtrain.fit`, which chooses the step's form by "
         "measurement); unroll a short loop fully (`lax.scan(..., unroll=True)`); or use an im2col convolution "
         "(`jaxtrain.models.Conv2D`), which runs at full speed in a loop body.",
         "about 9-14x per step on XLA:CPU; none on GPU", "medium"),
    Rule("step-loop", "low", "Python loop over a jitted step",
         "Each step is one dispatch from Python (~7 us on CPU, more with many arguments); for small models "
         "that overhead is a visible share of the step.",
         "Fuse K steps into one compiled call with `jax.lax.scan` over the steps; `jaxtrain.fit` does it "
         "automatically (--steps-per-call K; 0 chooses K).",
         "1.05-1.3x per step for small models (1.08x on the ladder, variant 3 -> 4)", "medium"),
    Rule("no-donation", "low", "jitted step without buffer donation",
         "Without donation the old parameters and optimizer state stay alive while the new ones are written: "
         "twice their memory at the peak, and an extra copy.",
         "`jax.jit(step, donate_argnums=(0, 1))` (or `donate_argnames`) for the state the step replaces; "
         "`jaxtrain.fit` donates the train state automatically.",
         "up to 2x less peak memory for parameters and optimizer state; little speed", "medium"),
    Rule("whole-dataset-load", "low", "whole dataset read into host memory",
         "Host memory grows with the dataset: fine for small data, an out-of-memory error (or swapping) for "
         "data bigger than RAM.",
         "Stream it: `jaxtrain.data.HDF5Source(path, {\"x\": \"features\", \"y\": \"targets\"})` passed to "
         "`jaxtrain.fit` (or `--data.path FILE.h5`) reads contiguous chunks in bounded memory; "
         "`np.load(path, mmap_mode=\"r\")` for .npy files.",
         "memory bounded by batch size and queue depth, not dataset size", "medium"),
)}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One match of a rule.

    Attributes:
      path: the file, as given (or found under a given directory).
      line, col: 1-based position of the matched code.
      rule: the rule id (a key of `RULES`).
      severity: the finding's severity (the rule's, or lower where the check says why).
      confidence: high / medium / low.
      message: what was matched, naming the code.
      function: the enclosing function's name, or "" at module level.
    """

    path: str
    line: int
    col: int
    rule: str
    severity: Severity
    confidence: str
    message: str
    function: str = ""

    def to_dict(self) -> dict[str, object]:
        """The finding with its rule's why, fix and gain, for JSON."""
        r = RULES[self.rule]
        return {**dataclasses.asdict(self), "what": r.message, "why": r.why, "fix": r.fix, "gain": r.gain}


@dataclasses.dataclass(frozen=True)
class ScanResult:
    """What `scan_paths` found.

    Attributes:
      files: the Python files read, in order.
      findings: every finding, sorted by file, line and column.
    """

    files: tuple[str, ...]
    findings: tuple[Finding, ...]

    def counts(self) -> dict[str, int]:
        """Findings per severity, every severity present (0 where none)."""
        return {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}

    def fails(self, fail_on: str) -> bool:
        """Whether a finding of severity `fail_on` or worse exists ("never": never)."""
        if fail_on not in FAIL_ON:
            raise ConfigError(f"--fail-on {fail_on!r}: choose one of {', '.join(FAIL_ON)}")
        if fail_on == "never":
            return False
        worst = SEVERITIES[: SEVERITIES.index(fail_on) + 1]
        return any(f.severity in worst for f in self.findings)


# --------------------------------------------------------------------------------------------
# Names JAX code uses

JIT = {"jax.jit", "jax.pmap", "jax.pjit", "jax.experimental.pjit.pjit", "flax.nnx.jit", "flax.nnx.pmap",
       "equinox.filter_jit", "equinox.filter_pmap"}
GRAD = {"jax.grad", "jax.value_and_grad", "flax.nnx.grad", "flax.nnx.value_and_grad", "equinox.filter_grad",
        "equinox.filter_value_and_grad"}
FUSED_LOOPS = {"jax.lax.scan", "jax.lax.fori_loop", "jax.lax.while_loop", "flax.nnx.scan", "flax.nnx.fori_loop",
               "flax.nnx.while_loop"}
TRANSFER = {"jax.numpy.array", "jax.numpy.asarray", "jax.device_put"}
TREE_MAP = {"jax.tree.map", "jax.tree_map", "jax.tree_util.tree_map", "jax.tree_multimap",
            "jax.tree_util.tree_multimap"}
UPDATE_CALLS = re.compile(r"(^|\.)(apply_updates|apply_gradients)$")
DEFAULT_ALIASES = {"jax": "jax", "jnp": "jax.numpy", "np": "numpy", "nnx": "flax.nnx", "lax": "jax.lax",
                   "optax": "optax", "h5py": "h5py", "eqx": "equinox", "pd": "pandas"}
LR_NAME = re.compile(r"(^|_)(lr|learning_rate|eta|step_size|alpha)$|^LR$", re.IGNORECASE)
GRAD_NAME = re.compile(r"grad|^g\d*$|^g_|^d(w|b|p|params|theta|weights?|bias)\d*$|^updates?$", re.IGNORECASE)
BATCH_NAME = re.compile(r"^(x|xs|y|ys|X|Y|batch|inputs?|targets|x_?batch|batch_?x|xb|yb|images)$")
BATCH_SIZE_NAME = re.compile(r"^(b|bs|batch_size|batch|n_?rows|num_samples|n_samples)$", re.IGNORECASE)
PER_SAMPLE_CALLEE = re.compile(r"model|net|forward|apply|predict|mlp|loss|logits|score", re.IGNORECASE)
STEP_NAME = re.compile(r"^(train|training|update|learn|learner|optim\w*|sgd|fit)_?step$|^train_(on_)?batch$",
                       re.IGNORECASE)  # a step defined elsewhere: `state = train_step(state, batch)`
STATE_ARG = re.compile(r"^(params|state|opt_state|train_state|model_state)$")  # learner.update(params, opt_state, b)
TRAINING_NAME = re.compile(r"train|update|learn|optim|sgd|grad|fit", re.IGNORECASE)
SUPPRESS = re.compile(r"#\s*jaxtrain:\s*ignore(\[(?P<ids>[^\]]*)\])?")

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
LOOPS = (ast.For, ast.AsyncFor, ast.While)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _snippet(node: ast.AST, source: str, width: int = 60) -> str:
    text = " ".join((ast.get_source_segment(source, node) or ast.unparse(node)).split())
    return text if len(text) <= width else text[: width - 3] + "..."


class _Module:
    """One parsed file and what the checks need to know about it."""

    def __init__(self, tree: ast.Module, source: str, path: str):
        self.tree, self.source, self.path = tree, source, path
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.aliases = self._aliases()
        self.bindings: dict[Scope, dict[str, list[ast.AST]]] = {}  # scope -> name -> FunctionDef or bound value
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._bind(self.scope(node), node.name, node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self._bind(self.scope(node), node.targets[0].id, node.value)
            elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
                self._bind(self.scope(node), node.optional_vars.id, node.context_expr)
        self.functions: list[FunctionNode] = [n for n in ast.walk(tree) if isinstance(n, FunctionNode)]
        self.uses_jax = any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
            (getattr(n, "module", None) or a.name).split(".")[0] in ("jax", "flax", "equinox") for a in n.names)
            for n in ast.walk(tree))
        self._device: dict[ast.AST, set[str]] = {}
        self._assigned: dict[ast.AST, dict[str, list[tuple[int, ast.AST]]]] = {}
        self._callers: dict[ast.AST, list[ast.Call]] = {}
        self._trains: dict[FunctionNode, bool] = {}
        self._numpy: dict[ast.AST, set[str]] = {}
        self.context = self._contexts()
        self.step_defs = self._step_defs()
        self.step_loops = self._step_loops()

    # -- names ---------------------------------------------------------------------------------

    def _aliases(self) -> dict[str, str]:
        aliases = dict(DEFAULT_ALIASES)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        return aliases

    def qualname(self, node: ast.AST) -> str | None:
        """`jnp.asarray` -> "jax.numpy.asarray" (through the file's imports); None for other expressions."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def _bind(self, scope: Scope, name: str, value: ast.AST) -> None:
        self.bindings.setdefault(scope, {}).setdefault(name, []).append(value)

    def scope(self, node: ast.AST) -> Scope:
        """The function (or module) whose local names `node` sees first."""
        p = self.parent.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            p = self.parent.get(p)
        return p if p is not None else self.tree

    def function(self, node: ast.AST) -> FunctionNode | None:
        scope = self.scope(node)
        return None if isinstance(scope, ast.Module) else scope

    def function_name(self, node: ast.AST) -> str:
        names, f = [], self.function(node)
        while f is not None:
            names.append(f.name if not isinstance(f, ast.Lambda) else "<lambda>")
            f = self.function(f)
        return ".".join(reversed(names))

    def resolve(self, name: str, at: ast.AST) -> list[ast.AST]:
        """The bindings of `name` visible at `at`: the innermost scope that binds it."""
        scope: ast.AST | None = self.scope(at)
        while scope is not None:
            found = self.bindings.get(scope, {}).get(name)  # type: ignore[call-overload]  # scopes are the keys
            if found:
                return found
            scope = None if isinstance(scope, ast.Module) else self.scope(scope)
        return []

    def resolve_defs(self, node: ast.AST) -> list[FunctionNode]:
        """The functions an expression names (a def, a lambda, or a name bound to one)."""
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            return [node]
        if isinstance(node, ast.Name):
            return [b for b in self.resolve(node.id, node) if isinstance(b, FunctionNode)]
        return []

    # -- jit and grad ----------------------------------------------------------------------------

    def is_jit(self, node: ast.AST) -> bool:
        """`jax.jit`, `partial(jax.jit, ...)`, `jax.jit(...)` used as a decorator factory."""
        if isinstance(node, ast.Call):
            name = self.qualname(node.func)
            if name in ("functools.partial", "partial") and node.args:
                return self.is_jit(node.args[0])
            return name in JIT and not node.args  # @jax.jit(donate_argnums=...)
        return self.qualname(node) in JIT

    def jit_call(self, node: ast.AST) -> ast.Call | None:
        """`node` if it is `jax.jit(f, ...)` or `partial(jax.jit, ...)(f)`, else None."""
        if isinstance(node, ast.Call) and node.args and (self.qualname(node.func) in JIT or (
                isinstance(node.func, ast.Call) and self.is_jit(node.func))):
            return node
        return None

    def jit_target(self, node: ast.AST) -> ast.Call | None:
        """The `jax.jit(f, ...)` call under `.lower(...).compile()` chains, if any."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "lower", "compile"):
            node = node.func.value
        return self.jit_call(node)

    def donates(self, jit: ast.AST) -> bool:
        calls = [n for n in ast.walk(jit) if isinstance(n, ast.Call)] if isinstance(jit, ast.Call) else []
        return any(k.arg in ("donate_argnums", "donate_argnames") for c in calls for k in c.keywords)

    def is_grad_transform(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and self.qualname(node.func) in GRAD

    def grad_application(self, call: ast.Call) -> bool:
        """`jax.grad(f)(x)` or `g(x)` with `g = jax.value_and_grad(f)` in scope."""
        if self.is_grad_transform(call.func):
            return True
        if isinstance(call.func, ast.Name):
            return any(self.is_grad_transform(b) for b in self.resolve(call.func.id, call))
        return False

    def jitted_function(self, call: ast.Call) -> ast.AST | None:
        """For a call of a jitted function: what was jitted (a def, or the expression given to jit)."""
        if (jit := self.jit_call(call.func)) is not None:
            return jit.args[0]
        if not isinstance(call.func, ast.Name):
            return None
        for b in self.resolve(call.func.id, call):
            if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(self.is_jit, b.decorator_list)):
                return b
            jit = self.jit_target(b)
            if jit is not None:
                return jit.args[0]
        return None

    def jitted_binding(self, call: ast.Call) -> list[FunctionNode] | None:
        """For a call of a jitted function: the functions it compiles ([] if not in this file); None if
        the call is not of a jitted function."""
        fn = self.jitted_function(call)
        return None if fn is None else self.resolve_defs(fn)

    def _contexts(self) -> dict[FunctionNode, str]:
        """"traced" (runs under jit), "maybe" (returned, passed or assigned: may be jitted elsewhere) or
        "eager", per function; nested functions and functions named inside one inherit its context."""
        context = {f: "eager" for f in self.functions}
        for f in self.functions:
            if isinstance(f, ast.Lambda):
                continue
            if any(map(self.is_jit, f.decorator_list)):
                context[f] = "traced"
        for node in ast.walk(self.tree):
            jit = self.jit_call(node)
            if jit is not None:
                for f in self.resolve_defs(jit.args[0]):
                    context[f] = "traced"
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and not self._called(node) \
                    and not self._in_module_registry(node):
                for f in self.resolve_defs(node):
                    context[f] = max(context[f], "maybe", key=("eager", "maybe", "traced").index)
            elif isinstance(node, ast.Lambda) and isinstance(self.parent.get(node), (ast.Call, ast.Return)):
                context[node] = max(context[node], "maybe", key=("eager", "maybe", "traced").index)
        rank = ("eager", "maybe", "traced").index
        changed = True
        while changed:  # propagate into nested functions and the functions a traced body names
            changed = False
            for f in self.functions:
                inner = [n for n in ast.walk(f) if n is not f and isinstance(n, FunctionNode)]
                named = [d for n in ast.walk(f) if isinstance(n, ast.Name) for d in self.resolve_defs(n)]
                for g in inner + (named if context[f] == "traced" else []):
                    if g is not f and rank(context[g]) < rank(context[f]):
                        context[g], changed = context[f], True
        return context

    def _called(self, name: ast.Name) -> bool:
        p = self.parent.get(name)
        return isinstance(p, ast.Call) and p.func is name

    def _in_module_registry(self, node: ast.AST) -> bool:
        """A name inside a module-level dict/list/tuple literal (a registry such as {0: ("a", a)})."""
        p, inside = self.parent.get(node), False
        while isinstance(p, (ast.Tuple, ast.List, ast.Dict, ast.Set)):
            p, inside = self.parent.get(p), True
        return inside and isinstance(p, (ast.Assign, ast.AnnAssign)) and isinstance(self.parent.get(p), ast.Module)

    def in_context(self, node: ast.AST) -> str:
        f = self.function(node)
        return "eager" if f is None else self.context[f]

    # -- training steps and the loops that call them -----------------------------------------------

    def _step_defs(self) -> set[FunctionNode]:
        """Eager functions that are one training step: they compute a gradient or call a jitted step
        (directly or through another step), and never in a loop (a function that loops over steps is a
        training loop, not a step)."""
        steps: set[FunctionNode] = set()
        changed = True
        while changed:
            changed = False
            for f in self.functions:
                if f in steps or self.context[f] == "traced":
                    continue
                calls = [n for n in _walk_local_scope(f) if isinstance(n, ast.Call) and self.step_call_kind(n, steps)]
                if calls and not any(self.loops_of(c) for c in calls):
                    steps.add(f)
                    changed = True
        return steps

    def step_call_kind(self, call: ast.Call, steps: set[FunctionNode] | None = None) -> str:
        """"grad", "jit", "eager-step", "named" (a call named like a step) or "" for other calls."""
        if self.grad_application(call):
            return "grad"
        fn = self.jitted_function(call)
        if fn is not None:  # a jitted function: a step if it trains (or, defined elsewhere, is named so)
            compiled = self.resolve_defs(fn)
            if compiled:
                return "jit" if any(self.trains(d) for d in compiled) else ""
            names = f"{self.qualname(call.func) or ''} {ast.unparse(fn)}"
            return "jit" if TRAINING_NAME.search(names) else ""
        defs = self.resolve_defs(call.func)
        if defs and any(d in (self.step_defs if steps is None else steps) for d in defs):
            return "eager-step"
        name = self.qualname(call.func) or ""
        last = name.rsplit(".", 1)[-1]
        if not defs and steps is None and self.uses_jax and (STEP_NAME.search(last) or (
                last == "update" and isinstance(call.func, ast.Attribute) and any(
                    isinstance(a, ast.Name) and STATE_ARG.match(a.id) for a in call.args))):
            return "named"
        return ""

    def trains(self, f: FunctionNode, depth: int = 0) -> bool:
        """Computes a gradient or applies an update, itself or in the functions it calls (3 levels)."""
        if f not in self._trains:
            self._trains[f] = False  # while looking (recursion)
            for n in ast.walk(f):
                if isinstance(n, ast.Call) and (self.grad_application(n) or UPDATE_CALLS.search(
                        self.qualname(n.func) or "") or (depth < 3 and any(
                        self.trains(d, depth + 1) for d in self.resolve_defs(n.func) if d is not f))):
                    self._trains[f] = True
                    break
        return self._trains[f]

    def loops_of(self, node: ast.AST) -> list[ast.AST]:
        """The loops whose every iteration runs `node`, innermost first, up to its function."""
        loops: list[ast.AST] = []
        child, p = node, self.parent.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            if isinstance(p, (ast.For, ast.AsyncFor)) and child in p.body:
                loops.append(p)
            elif isinstance(p, ast.While) and (child in p.body or child is p.test):
                loops.append(p)
            elif isinstance(p, ast.comprehension) and child is not p.iter:
                loops.append(self.parent[p])
            elif isinstance(p, COMPREHENSIONS) and child is not p.generators[0]:
                loops.append(p)
            child, p = p, self.parent.get(p)
        return loops

    def _step_loops(self) -> dict[ast.AST, list[tuple[ast.Call, str]]]:
        loops: dict[ast.AST, list[tuple[ast.Call, str]]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and self.in_context(node) != "traced":
                kind = self.step_call_kind(node)
                enclosing = [lp for lp in self.loops_of(node) if isinstance(lp, LOOPS)]
                if kind and enclosing:
                    loops.setdefault(enclosing[0], []).append((node, kind))
        return loops

    def periodic(self, node: ast.AST, loop: ast.AST) -> bool:
        """Under an `if` with a comparison or `%` between `node` and `loop`: not every iteration."""
        p = self.parent.get(node)
        while p is not None and p is not loop:
            if isinstance(p, ast.If) and any(isinstance(n, (ast.Compare, ast.Mod)) for n in ast.walk(p.test)):
                return True
            p = self.parent.get(p)
        return False

    def per_step_nodes(self) -> Iterator[tuple[ast.AST, ast.AST, int | None]]:
        """(node, step loop, line of the call that runs it from the loop, or None) for every node that
        runs once per training step: a step loop's body and the eager helpers it calls (two levels)."""
        seen: set[ast.AST] = set()
        for loop in self.step_loops:
            body = [n for stmt in loop.body for n in _walk_local(stmt)]  # type: ignore[attr-defined]  # for or while
            yield from ((n, loop, None) for n in body)
            frontier = [(n, 0) for n in body if isinstance(n, ast.Call)]
            it = getattr(loop, "iter", None)  # `for batch in data.batches(n)`: its loop around `yield` runs per step
            for d in self.callee_defs(it) if isinstance(it, ast.Call) else []:
                if d in seen or isinstance(d, ast.Lambda) or self.context[d] == "traced":
                    continue
                seen.add(d)
                inner = [n for lp in _walk_local_scope(d) if isinstance(lp, LOOPS) and any(
                    isinstance(y, (ast.Yield, ast.YieldFrom)) for y in _walk_local(lp))
                    for stmt in lp.body for n in _walk_local(stmt)]
                yield from ((n, loop, it.lineno) for n in inner)  # type: ignore[union-attr]  # a call here
                frontier += [(n, 1) for n in inner if isinstance(n, ast.Call)]
            while frontier:
                call, depth = frontier.pop()
                if depth >= 2 or self.periodic(call, loop):
                    continue
                for d in self.callee_defs(call):
                    if d in seen or isinstance(d, ast.Lambda) or self.context[d] == "traced":
                        continue
                    seen.add(d)
                    inner = [n for stmt in d.body for n in _walk_runs(stmt)]
                    yield from ((n, loop, call.lineno) for n in inner)
                    frontier += [(n, depth + 1) for n in inner if isinstance(n, ast.Call)]

    def callee_defs(self, call: ast.Call) -> list[FunctionNode]:
        """The functions a call runs: `f(...)` through scopes, `obj.method(...)` when exactly one def of this
        file has that name (a method of a class defined here)."""
        if isinstance(call.func, ast.Attribute):
            defs: list[FunctionNode] = [
                f for f in self.functions if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                and f.name == call.func.attr and isinstance(self.parent.get(f), ast.ClassDef)]
            return defs if len(defs) == 1 else []
        return self.resolve_defs(call.func)

    def computes_with_jax(self, f: FunctionNode, depth: int = 0) -> bool:
        """A local function whose body calls jax (directly or through local functions, 2 levels)."""
        for n in ast.walk(f):
            if isinstance(n, ast.Call):
                if (self.qualname(n.func) or "").split(".")[0] in ("jax", "flax", "optax", "equinox"):
                    return True
                if depth < 2 and any(self.computes_with_jax(d, depth + 1) for d in self.resolve_defs(n.func)
                                     if d is not f):
                    return True
        return False

    def device_call(self, call: ast.Call) -> bool:
        """A call whose result is on the device: a step, a gradient, a jax/flax/optax function (not
        `jax.device_get` or a tree map), or local functions that all compute with jax."""
        name = self.qualname(call.func) or ""
        local = [d for d in self.resolve_defs(call.func) if not isinstance(d, ast.Lambda)]
        return bool(self.step_call_kind(call) or (name.split(".")[0] in ("jax", "flax", "optax")
                                                  and name != "jax.device_get" and name not in TREE_MAP) or (
            local and all(self.computes_with_jax(d) for d in local)))

    def device_names(self, scope: ast.AST) -> set[str]:
        """Names in `scope` bound (anywhere in it) to results of steps, gradients or jax calls (values
        on the device). `device_at` asks where a name is read."""
        if scope in self._device:
            return self._device[scope]
        names = self._device[scope] = set()
        for node in _walk_local_scope(scope):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
                if self.device_call(node.value):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        return names

    def _assignments(self, scope: ast.AST) -> dict[str, list[tuple[int, ast.AST]]]:
        """name -> (line, value) of each assignment in `scope` (a tuple target gets the whole value), in order."""
        if scope not in self._assigned:
            found: dict[str, list[tuple[int, ast.AST]]] = {}
            for node in _walk_local_scope(scope):
                if isinstance(node, ast.Assign):
                    pairs = [(t, node.value) for t in node.targets]
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                    pairs = [(node.target, node.value)]
                elif isinstance(node, (ast.For, ast.AsyncFor)):
                    pairs = [(node.target, node.iter)]
                else:
                    continue
                for target, value in pairs:
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name):
                            found.setdefault(n.id, []).append((node.lineno, value))
            self._assigned[scope] = {k: sorted(v, key=lambda a: a[0]) for k, v in found.items()}
        return self._assigned[scope]

    def device_at(self, name: ast.Name, depth: int = 0) -> bool:
        """Whether `name` holds a device value where it is read: its last assignment before that line in
        its function (in a loop, one later in the body is the previous iteration's), so `x = jnp.asarray(x)`
        copies a host `x` and `np.asarray(batch)` of a batch put on the device two lines later reads host data.
        Names not assigned in the function (arguments, globals) are not on the device unless the module
        binds them to device values."""
        scope, line = self.scope(name), name.lineno
        assigns = self._assignments(scope).get(name.id, [])
        loops = [lp for lp in self.loops_of(name) if isinstance(lp, LOOPS)]
        if loops:  # in a loop: this iteration's assignment before the read, else the previous iteration's
            start, end = loops[0].lineno, loops[0].end_lineno or loops[0].lineno
            inside = [a for a in assigns if start <= a[0] <= end]  # a for loop's target is bound at its line
            current = [a for a in inside if a[0] < line] or inside
            if current:
                return self.device_value(current[-1][1], depth)
        before = [a for a in assigns if a[0] < line]
        if before:
            return self.device_value(before[-1][1], depth)
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and depth < 3:  # an argument: as callers pass it
            params = [a.arg for a in [*scope.args.posonlyargs, *scope.args.args]]
            passed = self._passed(scope, name.id, params) if name.id in params else iter(())
            if any(self.device_value(arg, depth + 1) for arg in passed):
                return True
        return not isinstance(scope, ast.Module) and name.id in self.device_names(self.tree)  # a global

    def _passed(self, f: ast.FunctionDef | ast.AsyncFunctionDef, param: str, params: list[str]) -> Iterator[ast.AST]:
        """What the calls of `f` in this file (by name) pass as its argument `param`."""
        if f not in self._callers:
            self._callers[f] = [c for c in ast.walk(self.tree) if isinstance(c, ast.Call)
                                and isinstance(c.func, ast.Name) and f in self.resolve_defs(c.func)]
        i = params.index(param)
        for call in self._callers[f]:
            if i < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:i + 1]):
                yield call.args[i]
            yield from (k.value for k in call.keywords if k.arg == param)

    def device_value(self, value: ast.AST, depth: int = 0) -> bool:
        """An expression on the device: a device call, or arithmetic, indexing or a method of device values."""
        if depth > 3:
            return False
        if isinstance(value, ast.Call):
            if self.device_call(value):
                return True
            return isinstance(value.func, ast.Attribute) and self.device_value(value.func.value, depth + 1)
        if isinstance(value, ast.Name):
            return self.device_at(value, depth + 1)
        if isinstance(value, (ast.BinOp, ast.UnaryOp, ast.Subscript, ast.Attribute, ast.Tuple, ast.List)):
            return any(self.device_value(n, depth + 1) for n in ast.iter_child_nodes(value)
                       if isinstance(n, (ast.Name, ast.Call, ast.BinOp, ast.Subscript, ast.Attribute)))
        return False

    def numpy_names(self, scope: ast.AST) -> set[str]:
        """Names in `scope` (or the module) bound to NumPy arrays or generators: results of `np.*` calls,
        of methods on such names, of arithmetic and indexing on them, of local functions returning them."""
        if scope in self._numpy:
            return self._numpy[scope]
        names = self._numpy[scope] = set() if isinstance(scope, ast.Module) else set(self.numpy_names(self.tree))
        pairs: list[tuple[ast.AST, ast.AST]] = []
        for node in _walk_local_scope(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(
                            target.elts) == len(node.value.elts):
                        pairs += zip(target.elts, node.value.elts)
                    else:
                        pairs.append((target, node.value))
        changed = True
        while changed:
            changed = False
            for bound, value in pairs:
                new = {n.id for n in ast.walk(bound) if isinstance(n, ast.Name)} - names
                if new and self.is_numpy(value, names, scope):
                    names |= new
                    changed = True
        return names

    def is_numpy(self, node: ast.AST, names: set[str], scope: ast.AST, depth: int = 0) -> bool:
        device = self.device_names(scope)
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.Call):
            if (self.qualname(node.func) or "").startswith("numpy."):
                return True
            if isinstance(node.func, ast.Attribute):  # x.mean(0), rng.normal(...), x.astype(...)
                return self.is_numpy(node.func.value, names, scope, depth)
            for d in self.resolve_defs(node.func):  # a local function that returns NumPy arrays
                if depth < 2 and not isinstance(d, ast.Lambda) and self.context[d] != "traced":
                    returns = [r.value for r in _walk_local_scope(d) if isinstance(r, ast.Return) and r.value]
                    inner = self.numpy_names(d)
                    if returns and all(all(self.is_numpy(e, inner, d, depth + 1) for e in (
                            r.elts if isinstance(r, ast.Tuple) else [r])) for r in returns):
                        return True
            return False
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Subscript)):
            mentioned = set(self._array_names(node))
            return bool(mentioned & names) and not mentioned & device
        return False

    def _array_names(self, node: ast.AST) -> Iterator[str]:
        """Names used as values in `node`: not those only asked for a shape (`x.shape[0]`, `len(x)`)."""
        if isinstance(node, ast.Attribute) and node.attr in ("shape", "size", "ndim", "dtype"):
            return
        if isinstance(node, ast.Call) and self.qualname(node.func) == "len":
            return
        if isinstance(node, ast.Name):
            yield node.id
        for child in ast.iter_child_nodes(node):
            yield from self._array_names(child)

    def finding(self, rule: str, node: ast.AST, message: str, severity: Severity | None = None,
                confidence: str | None = None) -> Finding:
        r = RULES[rule]
        where = node.lineno, node.col_offset + 1  # type: ignore[attr-defined]  # statements and expressions only
        return Finding(self.path, *where, rule, severity or r.severity, confidence or r.confidence, message,
                       self.function_name(node))

    def snippet(self, node: ast.AST, width: int = 60) -> str:
        return _snippet(node, self.source, width)


def _walk_local(node: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk` that does not enter nested function or class definitions."""
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return
    for child in ast.iter_child_nodes(node):
        yield from _walk_local(child)


def _walk_runs(node: ast.AST) -> Iterator[ast.AST]:
    """`_walk_local`, entering lambdas given to a call (`jax.tree.map(lambda *t: np.stack(t), *batch)` runs them)."""
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Lambda) and not (isinstance(node, ast.Call) and child in node.args):
            continue
        yield from _walk_runs(child)


def _walk_local_scope(scope: ast.AST) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(scope):
        yield from _walk_local(child)


def _loop_line(loop: ast.AST) -> str:
    return f"loop at line {loop.lineno}"  # type: ignore[attr-defined]  # a statement or a comprehension


def _via(line: int | None) -> str:
    return f", called every step from line {line}" if line else ""


# --------------------------------------------------------------------------------------------
# The checks: one per rule

CheckFn = Callable[[_Module], Iterable[Finding]]
CHECKS: dict[str, CheckFn] = {}


def _check(rule: str) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        CHECKS[rule] = fn
        return fn

    return register


@_check("unjitted-grad")
def _unjitted_grad(m: _Module) -> Iterator[Finding]:
    for node in ast.walk(m.tree):
        if not (isinstance(node, ast.Call) and m.grad_application(node)):
            continue
        code, f = m.snippet(node), m.function(node)
        if m.in_context(node) == "traced":  # jitted as `step = jax.jit(f)`, yet a loop may call `f` itself
            if isinstance(f, ast.FunctionDef) and not any(map(m.is_jit, f.decorator_list)):
                plain = [c for c in ast.walk(m.tree) if isinstance(c, ast.Call) and f in m.resolve_defs(c.func)
                         and m.jitted_function(c) is None and m.in_context(c) != "traced"
                         and any(isinstance(lp, LOOPS) for lp in m.loops_of(c))]
                if plain:
                    yield m.finding("unjitted-grad", node, f"`{code}`: `{f.name}` is jitted elsewhere but the loop at "
                                    f"line {plain[0].lineno} calls it plain, so it runs eagerly", confidence="medium")
            continue
        loops = [lp for lp in m.loops_of(node) if isinstance(lp, LOOPS)]
        if loops:  # even in a function passed on (`app.run(main)`): nobody jits a loop over batches
            yield m.finding("unjitted-grad", node, f"`{code}` computes a gradient eagerly every iteration of the "
                            f"{_loop_line(loops[0])}", confidence="high" if m.in_context(node) == "eager" else "medium")
            continue
        if m.in_context(node) == "maybe":
            continue
        callers = [c for c in ast.walk(m.tree) if isinstance(c, ast.Call) and f is not None
                   and f in m.resolve_defs(c.func) and m.in_context(c) == "eager"
                   and any(isinstance(lp, LOOPS) for lp in m.loops_of(c))]
        if callers:
            yield m.finding("unjitted-grad", node, f"`{code}` computes a gradient eagerly in `{m.function_name(node)}`"
                            f", called every iteration of the loop at line {callers[0].lineno}", confidence="medium")
        elif f is None or m.function(f) is None:  # module level or a top-level def: nothing jits it here
            yield m.finding("unjitted-grad", node, f"`{code}` computes a gradient outside jit; nothing in this file "
                            "jits the function around it, and no loop here calls it", severity="low", confidence="low")


@_check("jit-in-loop")
def _jit_in_loop(m: _Module) -> Iterator[Finding]:
    for node in ast.walk(m.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(m.is_jit, node.decorator_list)):
            loops = [lp for lp in m.loops_of(node) if isinstance(lp, LOOPS)]
            if loops:
                yield m.finding("jit-in-loop", node, f"`@jit def {node.name}` is defined inside the "
                                f"{_loop_line(loops[0])}: a new function, traced and compiled again, every iteration")
            continue
        jit = m.jit_call(node)
        loops = [lp for lp in m.loops_of(node) if isinstance(lp, LOOPS)] if jit is not None else []
        if jit is None or not loops:
            continue
        p = m.parent.get(node)
        if isinstance(p, ast.Attribute) and p.attr == "lower":
            continue  # ahead-of-time compilation in a loop: deliberate (one program per shape)
        if isinstance(p, ast.Assign) and not all(isinstance(t, ast.Name) for t in p.targets):
            continue  # stored in a cache or container
        target = jit.args[0]
        defs = m.resolve_defs(target)
        new_each_time = isinstance(target, (ast.Lambda, ast.Call)) or any(
            lp in set(_ancestors(m, d)) for d in defs for lp in loops)
        called = isinstance(p, ast.Call) and p.func is node
        if isinstance(p, ast.Assign):
            name = p.targets[0].id  # type: ignore[attr-defined]  # a Name: others were skipped above
            called = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == name
                         for c in ast.walk(loops[0]))
        code = m.snippet(node)
        if new_each_time and called:
            yield m.finding("jit-in-loop", node, f"`{code}` in the {_loop_line(loops[0])} jits a new function every "
                            "iteration: traced and compiled each time")
        elif called:
            yield m.finding("jit-in-loop", node, f"`{code}` in the {_loop_line(loops[0])} re-wraps the function every "
                            "iteration: each call takes the slow dispatch path", severity="medium",
                            confidence="medium")
        else:
            yield m.finding("jit-in-loop", node, f"`{code}` is applied inside the {_loop_line(loops[0])}",
                            severity="low", confidence="low")


def _ancestors(m: _Module, node: ast.AST) -> Iterator[ast.AST]:
    p = m.parent.get(node)
    while p is not None:
        yield p
        p = m.parent.get(p)


@_check("per-batch-transfer")
def _per_batch_transfer(m: _Module) -> Iterator[Finding]:
    for node, loop, via in m.per_step_nodes():
        if not isinstance(node, ast.Call) or m.qualname(node.func) not in TRANSFER or not node.args:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) or m.periodic(node, loop) or m.in_context(node) == "traced":
            continue
        if isinstance(arg, ast.Name) and m.device_at(arg):
            continue  # already on the device where it is read: no copy
        yield m.finding("per-batch-transfer", node, f"`{m.snippet(node)}` copies host data to the device every step "
                        f"({_loop_line(loop)}{_via(via)})")


def _numpy_rngs(m: _Module) -> set[str]:
    names = set()
    for node in ast.walk(m.tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if (m.qualname(node.value.func) or "").startswith("numpy.random."):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


@_check("numpy-in-loop")
def _numpy_in_loop(m: _Module) -> Iterator[Finding]:
    rngs = _numpy_rngs(m)
    for node, loop, via in m.per_step_nodes():
        if not isinstance(node, ast.Call) or m.periodic(node, loop):
            continue
        name = m.qualname(node.func) or ""
        numpy = name.startswith("numpy.") and not name.startswith("numpy.testing.") and name not in (
            "numpy.asarray", "numpy.array", "numpy.float32")
        if name in ("numpy.float32", "numpy.float64") and node.args:  # a cast of a batch, not of a scalar setting
            numpy = isinstance(node.args[0], ast.Name) and bool(BATCH_NAME.match(node.args[0].id))
        if name in ("numpy.asarray", "numpy.array"):  # of host data; of a device value it is a host sync
            numpy = bool(node.args) and not any(isinstance(n, ast.Name) and m.device_at(n) for n in ast.walk(
                node.args[0]))
        if isinstance(node.func, ast.Attribute):
            owner = node.func.value
            numpy |= isinstance(owner, ast.Name) and owner.id in rngs  # rng.standard_normal(...)
            numpy |= node.func.attr == "astype" and any((m.qualname(a) or "").startswith("numpy.") for a in node.args)
        args = [*node.args, *(k.value for k in node.keywords)]
        if numpy and args and not all(isinstance(a, ast.Constant) for a in args):
            yield m.finding("numpy-in-loop", node, f"`{m.snippet(node)}` runs NumPy on the host every step "
                            f"({_loop_line(loop)}{_via(via)})")
    for node, loop, via in m.per_step_nodes():  # arithmetic on NumPy arrays: (x[rows] - mean) / std
        if isinstance(node, (ast.BinOp, ast.UnaryOp)) and not isinstance(m.parent.get(node), (ast.BinOp, ast.UnaryOp)) \
                and not m.periodic(node, loop) and (m.is_numpy(node, m.numpy_names(m.scope(node)), m.scope(node))
                                                    or _copied_after(m, node)):
            yield m.finding("numpy-in-loop", node, f"`{m.snippet(node)}` computes with NumPy arrays on the host every "
                            f"step ({_loop_line(loop)}{_via(via)})")


def _copied_after(m: _Module, node: ast.AST) -> bool:
    """Array arithmetic assigned to a name that its function copies to the device afterwards (`xb = (X[rows] -
    mu) / sd` then `jnp.array(xb)`): the arithmetic ran on the host, whatever `X` is (an argument, say)."""
    p = m.parent.get(node)
    if not (isinstance(p, ast.Assign) and p.value is node and len(p.targets) == 1
            and isinstance(p.targets[0], ast.Name)):
        return False
    if not any(isinstance(n, (ast.Subscript, ast.Call)) for n in ast.walk(node)) or any(
            isinstance(n, ast.Name) and m.device_at(n) for n in ast.walk(node)):
        return False  # scalar arithmetic, or computed on the device
    name, scope = p.targets[0].id, m.scope(p)
    return any(isinstance(c, ast.Call) and m.qualname(c.func) in TRANSFER and c.args and isinstance(c.args[0], ast.Name)
               and c.args[0].id == name and c.lineno > p.lineno for c in _walk_local_scope(scope))


SYNC_BUILTINS = {"float", "int", "bool"}
SYNC_FUNCTIONS = {"numpy.asarray", "numpy.array", "jax.device_get"}
SYNC_METHODS = {"item", "tolist"}
WAITS = ("jax.block_until_ready", "block_until_ready")  # a wait whatever it is given: it exists to wait
LOG_CALLS = re.compile(r"^(print|.*\.(info|debug|warning|log))$")


def _epoch_loop(m: _Module, loop: ast.AST) -> bool:
    """A loop once per epoch: it holds a loop over steps, or every step it calls is a compiled call that loops
    over many steps itself (`lax.scan` / `fori_loop` over the epoch's batches)."""
    if any(inner is not loop and inner in m.step_loops for inner in ast.walk(loop)):
        return True
    calls = m.step_loops.get(loop, [])
    return bool(calls) and all(kind == "jit" and any(
        isinstance(n, ast.Call) and m.qualname(n.func) in FUSED_LOOPS
        for d in (m.jitted_binding(call) or []) for n in ast.walk(d)) for call, kind in calls)


@_check("host-sync")
def _host_sync(m: _Module) -> Iterator[Finding]:
    seen: set[ast.AST] = set()
    for node, loop, via in m.per_step_nodes():  # the loop's body and the helpers it calls every step
        if not isinstance(node, ast.Call) or node in seen or m.periodic(node, loop) or _epoch_loop(m, loop):
            continue  # (a read once per epoch costs one stall per epoch: fine)
        if m.in_context(node) == "traced":
            continue
        seen.add(node)
        name = m.qualname(node.func) or ""
        mentions = any(isinstance(n, ast.Name) and m.device_at(n)
                       for a in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(a))
        method = isinstance(node.func, ast.Attribute) and node.func.attr in SYNC_METHODS and any(
            isinstance(n, ast.Name) and m.device_at(n) for n in ast.walk(node.func.value))
        waits = name in WAITS or (isinstance(node.func, ast.Attribute) and node.func.attr in WAITS)
        if waits or method or ((name in SYNC_BUILTINS or name in SYNC_FUNCTIONS or LOG_CALLS.match(name)) and mentions):
            yield m.finding("host-sync", node, f"`{m.snippet(node)}` waits for the device every step "
                            f"({_loop_line(loop)}{_via(via)})")


def _is_sgd_product(m: _Module, node: ast.AST) -> bool:
    """`lr * g` (either order): one factor named like a learning rate, the other like a gradient."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return False

    def names(n: ast.AST) -> list[str]:
        return [x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(n)
                if isinstance(x, (ast.Name, ast.Attribute))]

    def lr(n: ast.AST) -> bool:
        return isinstance(n, ast.Constant) or any(LR_NAME.search(x) for x in names(n))

    def grad(n: ast.AST) -> bool:
        return any(GRAD_NAME.search(x) for x in names(n))

    return (lr(node.left) and grad(node.right)) or (grad(node.left) and lr(node.right))


@_check("manual-update")
def _manual_update(m: _Module) -> Iterator[Finding]:
    reported: set[int] = set()
    for node in ast.walk(m.tree):
        match: ast.AST | None = None
        if isinstance(node, ast.Call) and m.qualname(node.func) in TREE_MAP and node.args and isinstance(
                node.args[0], ast.Lambda):
            lam = node.args[0]
            params = [a.arg for a in lam.args.args]
            body = lam.body
            if len(params) >= 2 and isinstance(body, ast.BinOp) and isinstance(body.op, ast.Sub) and \
                    _is_sgd_product(m, body.right):
                match = node
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _is_sgd_product(m, node.right):
            match = node
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub) and _is_sgd_product(m, node.value):
            match = node
        if match is None or any(_inside(m, match, r) for r in reported):
            continue
        reported.add(id(match))
        context = m.in_context(match)
        eager = context == "eager" or (context == "maybe" and any(isinstance(lp, LOOPS) for lp in m.loops_of(match)))
        where = "eagerly, leaf by leaf" if eager else "under jit" if context == "traced" else "if it runs under jit"
        yield m.finding("manual-update", match, f"`{m.snippet(match)}` updates parameters by hand ({where})",
                        severity="medium" if eager else "low")


def _inside(m: _Module, node: ast.AST, reported_id: int) -> bool:
    return any(id(a) == reported_id for a in _ancestors(m, node))


@_check("row-loop")
def _row_loop(m: _Module) -> Iterator[Finding]:
    for node in ast.walk(m.tree):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            target, it, body = node.target, node.iter, [n for s in node.body for n in _walk_local(s)]
        elif isinstance(node, COMPREHENSIONS) and len(node.generators) == 1:
            target, it = node.generators[0].target, node.generators[0].iter
            body = [n for e in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])
                    for n in _walk_local(e)]
        else:
            continue
        loop_vars = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        if not loop_vars or not _over_rows(m, it):
            continue
        for call in body:
            if isinstance(call, ast.Call) and _per_sample_callee(m, call) and any(
                    _is_row(a, loop_vars) for a in [*call.args, *(k.value for k in call.keywords)]):
                traced = m.in_context(node) == "traced"
                yield m.finding("row-loop", node, f"the loop over `{m.snippet(it, 40)}` calls `{m.snippet(call, 40)}` "
                                f"once per sample{' (unrolled under jit)' if traced else ''}",
                                severity="medium" if traced else "high")
                break


def _over_rows(m: _Module, it: ast.AST) -> bool:
    """`range(len(x))`, `range(x.shape[0])`, `range(batch_size)`, `zip(x, y)`, `enumerate(batch)`, `x`."""
    if isinstance(it, ast.Call) and m.qualname(it.func) == "range" and len(it.args) == 1:
        a = it.args[0]
        if isinstance(a, ast.Call) and m.qualname(a.func) == "len":
            return True
        if isinstance(a, ast.Subscript) and isinstance(a.value, ast.Attribute) and a.value.attr == "shape":
            return True
        return isinstance(a, ast.Name) and bool(BATCH_SIZE_NAME.match(a.id))
    if isinstance(it, ast.Call) and m.qualname(it.func) in ("zip", "enumerate"):
        return any(_batch_like(a) for a in it.args)
    return _batch_like(it)


def _batch_like(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return bool(BATCH_NAME.match(node.id))
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Name) and node.value.id in ("batch", "b") and isinstance(
            node.slice, ast.Constant)  # batch["x"]
    return False


def _per_sample_callee(m: _Module, call: ast.Call) -> bool:
    """A model, loss or step: a gradient, a jitted or step function, something named like a model or a
    loss, or a function of this file that computes with jax."""
    kind = m.step_call_kind(call)
    if kind:  # a gradient per sample is a row loop; a training step per item is a loop over batches
        return kind == "grad"
    if PER_SAMPLE_CALLEE.search((m.qualname(call.func) or "").rsplit(".", 1)[-1]):
        return True
    return any(isinstance(n, ast.MatMult) or (m.qualname(n.func) or "").startswith(("jax.", "flax."))
               for d in m.resolve_defs(call.func) for n in ast.walk(d) if isinstance(n, (ast.Call, ast.MatMult)))


def _is_row(arg: ast.AST, loop_vars: set[str]) -> bool:
    if isinstance(arg, ast.Name):
        return arg.id in loop_vars
    if isinstance(arg, ast.Subscript):
        return any(isinstance(n, ast.Name) and n.id in loop_vars for n in ast.walk(arg.slice))
    return False


@_check("step-loop")
def _step_loop(m: _Module) -> Iterator[Finding]:
    for loop, calls in m.step_loops.items():
        for call, kind in calls:
            if kind != "jit" or m.jit_call(call.func):  # jax.jit(f)(x) in a loop: jit-in-loop says it
                continue
            defs = m.jitted_binding(call) or []
            fused = any(m.qualname(n.func) in FUSED_LOOPS for d in defs for n in ast.walk(d) if isinstance(n, ast.Call))
            if not fused:
                yield m.finding("step-loop", call, f"`{m.snippet(call)}` is dispatched once per step from the "
                                f"{_loop_line(loop)}")
                break


def _returns_state(f: FunctionNode) -> bool:
    """Returns something built from its own arguments (the state it was given, updated)."""
    params = {a.arg for a in [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs]}
    returns = [f.body] if isinstance(f, ast.Lambda) else [
        r.value for r in _walk_local_scope(f) if isinstance(r, ast.Return) and r.value is not None]
    if not returns:
        return False
    assigned = {n.id for n in _walk_local_scope(f) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return any(isinstance(n, ast.Name) and n.id in params and (n.id in assigned or r is not n)
               for r in returns for n in ast.walk(r))


@_check("no-donation")
def _no_donation(m: _Module) -> Iterator[Finding]:
    for node in ast.walk(m.tree):
        targets: list[tuple[ast.AST, list[FunctionNode], ast.AST]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            targets = [(d, [node], d) for d in node.decorator_list if m.is_jit(d)]
        elif (call := m.jit_call(node)) is not None:
            targets = [(call, m.resolve_defs(call.args[0]), call)]
        for jit, defs, at in targets:
            if m.donates(jit):
                continue
            for f in defs:
                if m.trains(f) and _returns_state(f):
                    name = getattr(f, "name", "<lambda>")
                    yield m.finding("no-donation", at, f"`{name}` returns updated state but its jit donates no "
                                    "arguments")
                    break


@_check("whole-dataset-load")
def _whole_dataset_load(m: _Module) -> Iterator[Finding]:
    files = {name for scope in m.bindings.values() for name, values in scope.items()
             if any(isinstance(v, ast.Call) and m.qualname(v.func) == "h5py.File" for v in values)}

    def dataset(node: ast.AST, depth: int = 0) -> bool:  # f["x"] of an h5py.File, or a name bound to one
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in files:
            return isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
        if isinstance(node, ast.Name) and depth < 3:
            return any(dataset(b, depth + 1) for b in m.resolve(node.id, node))
        return False

    for node in ast.walk(m.tree):
        if isinstance(node, ast.Subscript) and dataset(node.value):
            s = node.slice
            whole = (isinstance(s, ast.Slice) and s.lower is None and s.upper is None and s.step is None) or (
                isinstance(s, ast.Tuple) and not s.elts) or (isinstance(s, ast.Constant) and s.value is Ellipsis)
            if whole:
                yield m.finding("whole-dataset-load", node, f"`{m.snippet(node)}` reads a whole HDF5 dataset into "
                                "memory", severity="medium", confidence="high")
            continue
        if not isinstance(node, ast.Call):
            continue
        name = m.qualname(node.func) or ""
        if name in ("numpy.asarray", "numpy.array") and node.args and dataset(node.args[0]):
            yield m.finding("whole-dataset-load", node, f"`{m.snippet(node)}` reads a whole HDF5 dataset into memory",
                            severity="medium", confidence="high")
        elif name == "numpy.load" and not any(k.arg == "mmap_mode" for k in node.keywords):
            yield m.finding("whole-dataset-load", node, f"`{m.snippet(node)}` reads the whole file into memory")
        elif name in ("numpy.loadtxt", "numpy.genfromtxt", "numpy.fromfile", "pandas.read_csv"):
            yield m.finding("whole-dataset-load", node, f"`{m.snippet(node)}` reads the whole file into memory")
        elif name in ("numpy.frombuffer", "numpy.fromstring") and node.args and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "read" and not n.args
                for n in ast.walk(node.args[0])):
            yield m.finding("whole-dataset-load", node, f"`{m.snippet(node)}` reads a whole file into an array")


LOOP_BODIES = {"jax.lax.scan": (0, "f"), "jax.lax.fori_loop": (2, "body_fun"), "jax.lax.while_loop": (1, "body_fun"),
               "flax.nnx.fori_loop": (2, "body_fun"), "flax.nnx.while_loop": (1, "body_fun")}  # (position, keyword)
CONV_OPS = {"jax.lax.conv_general_dilated", "jax.lax.conv", "jax.lax.conv_with_general_padding",
            "jax.lax.conv_transpose", "jax.lax.conv_general_dilated_local", "jax.numpy.convolve",
            "jax.numpy.correlate", "jax.scipy.signal.convolve", "jax.scipy.signal.convolve2d",
            "jax.scipy.signal.correlate", "jax.scipy.signal.correlate2d"}
CONV_LAYER = re.compile(r"^(flax\.nnx|flax\.linen|equinox\.nn|haiku)\.\w*Conv\w*$")  # nnx.Conv, eqx.nn.Conv2d, ...
WRAPPERS = JIT | GRAD | {"functools.partial", "partial", "jax.vmap", "jax.checkpoint", "jax.remat", "flax.nnx.vmap",
                         "flax.nnx.remat", "equinox.filter_vmap", "equinox.filter_checkpoint"}  # w(f)(...) runs f
MODEL_CALL = re.compile(r"model|net|cnn|apply_fn|^apply$|forward|predict|classifier", re.IGNORECASE)

ConvUse = tuple[str, bool]  # (what runs the convolution, for the message; sure: resolved, not guessed from a name)


class _Convs:
    """Which functions and model classes of one module run a convolution, directly or through the functions,
    methods and classes of the module they call. A call of an object the module cannot resolve (a parameter
    `model`, `state.apply_fn`) counts only when named like a model and every model the module builds
    (outside other models) builds a convolution."""

    def __init__(self, m: _Module):
        self.m = m
        self.classes = {c.name: c for c in ast.walk(m.tree) if isinstance(c, ast.ClassDef)}
        self._class: dict[ast.ClassDef, str | None] = {}
        self._fn: dict[ast.AST, ConvUse | None] = {}
        self.built: list[str] = []  # the model classes the module builds, when all of them build a convolution
        models = {c for c in self.classes.values() if self._is_model(c)}
        built = {self.classes[n.func.id] for n in ast.walk(m.tree) if isinstance(n, ast.Call) and isinstance(
            n.func, ast.Name) and self.classes.get(n.func.id) in models and not (set(_ancestors(m, n)) & models)}
        if built and all(map(self.class_conv, built)):
            self.built = sorted(c.name for c in built)
            self._fn.clear()  # looked at without the models known

    def _is_model(self, c: ast.ClassDef, depth: int = 0) -> bool:
        """Subclasses `nnx.Module`, `nn.Module`, `eqx.Module` or `hk.Module`, or a class of this file that does."""
        for base in c.bases:
            if (self.m.qualname(base) or "").rsplit(".", 1)[-1] == "Module":
                return True
            parent = self.classes.get(base.id) if isinstance(base, ast.Name) else None
            if parent is not None and parent is not c and depth < 5 and self._is_model(parent, depth + 1):
                return True
        return False

    def class_conv(self, c: ast.ClassDef) -> str | None:
        """The convolution a class builds or runs (`nnx.Conv`), in its own body or in the classes it builds."""
        if c not in self._class:
            self._class[c] = None  # while looking (recursion)
            found = self.conv_in(c)
            self._class[c] = found[0] if found and found[1] else None
        return self._class[c]

    def conv_in(self, root: ast.AST) -> ConvUse | None:
        """The first convolution `root` runs: a resolved one if any, else one guessed from a model's name."""
        if root in self._fn:
            return self._fn[root]
        self._fn[root] = None  # while looking (recursion)
        guess = None
        for node in ast.walk(root):
            found = self.call_conv(node) if isinstance(node, ast.Call) else None
            if found and found[1]:
                self._fn[root] = found
                return found
            guess = guess or found
        self._fn[root] = guess
        return guess

    def call_conv(self, call: ast.Call) -> ConvUse | None:
        m = self.m
        name = m.qualname(call.func) or ""
        if name in CONV_OPS or CONV_LAYER.match(name):
            return f"`{m.snippet(call.func, 40)}` at line {call.lineno}", True
        target = call.func
        while isinstance(target, ast.Call) and m.qualname(target.func) in WRAPPERS and target.args:
            target = target.args[0]  # jax.grad(loss_fn)(...), jax.vmap(model)(x), partial(step, lr)(...)
        return self.callee_conv(target, call, 0)

    def callee_conv(self, target: ast.AST, call: ast.Call, depth: int) -> ConvUse | None:
        """What `target(...)` runs (`call` is the call, for the message)."""
        m = self.m
        if isinstance(target, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            return self.conv_in(target)
        if isinstance(target, ast.Name):
            if target.id in self.classes and not m.resolve(target.id, target):  # a model built in the body
                conv = self.class_conv(self.classes[target.id])
                return (f"`{m.snippet(call, 40)}` at line {call.lineno}, which builds {conv}", True) if conv else None
            bindings = self.lookup(target)
            if bindings is None:
                return self._guess(target.id, call)
            for b in bindings:
                found = None
                if isinstance(b, FunctionNode):
                    found = self.conv_in(b)
                elif isinstance(b, ast.Call) and m.qualname(b.func) in WRAPPERS and b.args and depth < 3:
                    found = self.callee_conv(b.args[0], call, depth + 1)  # grad_fn = jax.value_and_grad(loss_fn)
                elif isinstance(b, ast.Call) and isinstance(b.func, ast.Name) and b.func.id in self.classes:
                    conv = self.class_conv(self.classes[b.func.id])  # model = CNN(...)
                    found = (f"`{m.snippet(call, 40)}` at line {call.lineno}, a `{b.func.id}`, which builds {conv}",
                             True) if conv else None
                    if not conv:
                        return None  # a model of this file without convolutions
                elif isinstance(b, ast.Call) and CONV_LAYER.match(m.qualname(b.func) or ""):
                    found = f"`{m.snippet(call, 40)}` at line {call.lineno}, a `{m.snippet(b.func, 30)}`", True
                else:
                    return self._guess(target.id, call)  # model = nnx.merge(graphdef, state)
                if found:
                    return found
            return None
        if isinstance(target, ast.Attribute):
            methods = [f for f in m.functions if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and f.name == target.attr and isinstance(m.parent.get(f), ast.ClassDef)]
            if len(methods) == 1:
                return self.conv_in(methods[0])
            if target.attr in ("apply", "__call__") and depth < 3:  # model.apply(variables, x)
                return self.callee_conv(target.value, call, depth + 1)
            if (m.qualname(target) or "").split(".")[0] in ("jax", "flax", "optax", "equinox", "numpy"):
                return None
            return self._guess(target.attr, call)  # self.model(x), state.apply_fn(params, x)
        return None

    def body_conv(self, body: ast.AST) -> ConvUse | None:
        """The convolution a loop body runs: `body` must name a function of this module."""
        m = self.m
        while isinstance(body, ast.Call) and m.qualname(body.func) in WRAPPERS and body.args:
            body = body.args[0]  # partial(body, graphdef)
        if isinstance(body, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            defs: list[ast.AST] = [body]
        elif isinstance(body, ast.Name):
            defs = [b for b in self.lookup(body) or [] if isinstance(b, FunctionNode)]
        elif isinstance(body, ast.Attribute):  # self._step: a method of a class of this module
            defs = [f for f in m.functions if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and f.name == body.attr and isinstance(m.parent.get(f), ast.ClassDef)]
            defs = defs if len(defs) == 1 else []
        else:
            defs = []
        found = [c for c in map(self.conv_in, defs) if c]
        return next((c for c in found if c[1]), found[0] if found else None)

    def lookup(self, name: ast.Name) -> list[ast.AST] | None:
        """The bindings of a name, or None where an enclosing function takes it as a parameter or assigns it
        in a way the module does not record (`model, opt = nnx.merge(...)`): its value is unknown here."""
        m, f = self.m, self.m.function(name)
        while f is not None:
            if m.bindings.get(f, {}).get(name.id):
                return m.bindings[f][name.id]
            a = f.args
            params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None}
            if name.id in params or any(isinstance(n, ast.Name) and n.id == name.id and isinstance(n.ctx, ast.Store)
                                        for n in _walk_local_scope(f)):
                return None
            f = m.function(f)
        return m.bindings.get(m.tree, {}).get(name.id, [])

    def _guess(self, name: str, call: ast.Call) -> ConvUse | None:
        if not (self.built and MODEL_CALL.search(name)):
            return None
        models = " / ".join(f"`{c}`" for c in self.built)
        convs = ", ".join(sorted({self.class_conv(self.classes[c]) or "" for c in self.built}))
        return (f"`{self.m.snippet(call, 40)}` at line {call.lineno}, presumably this file's {models}, which builds "
                f"{convs}", False)


def _loop_body(m: _Module, call: ast.Call) -> ast.AST | None:
    """The body function given to `lax.scan` / `fori_loop` / `while_loop`, unless the loop is fully unrolled."""
    position, keyword = LOOP_BODIES[m.qualname(call.func)]  # type: ignore[index]  # asked of LOOP_BODIES' calls
    unroll = next((k.value for k in call.keywords if k.arg == "unroll"), None)
    if unroll is not None and not (isinstance(unroll, ast.Constant) and type(unroll.value) is int):
        return None  # unroll=True (straight-line code), or a length the code computes: lean towards silence
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


@_check("conv-in-scan")
def _conv_in_scan(m: _Module) -> Iterator[Finding]:
    convs: _Convs | None = None
    for node in ast.walk(m.tree):
        if not (isinstance(node, ast.Call) and m.qualname(node.func) in LOOP_BODIES):
            continue
        body = _loop_body(m, node)
        if body is None:
            continue
        convs = convs or _Convs(m)
        found = convs.body_conv(body)
        if found is None:
            continue
        what, sure = found
        yield m.finding("conv-in-scan", node, f"the body of `{m.snippet(node, 50)}` runs a convolution, {what}: "
                        "XLA:CPU runs it about 9-14x slower in a loop body than in a plain jitted step",
                        confidence="high" if sure else "medium")


# --------------------------------------------------------------------------------------------
# Entry points


def _suppressed(line: str, rule: str) -> bool:
    match = SUPPRESS.search(line)
    if match is None:
        return False
    ids = match.group("ids")
    return ids is None or rule in {i.strip() for i in ids.split(",")}


def scan_source(source: str, path: str = "<string>") -> list[Finding]:
    """The findings of every rule in one file's source, sorted by line.

    Raises:
      ConfigError: the source is not valid Python (one line naming the file and line).
    """
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: not valid Python ({e.msg}); `jaxtrain scan` reads Python source "
                          "files") from None
    except ValueError as e:  # e.g. null bytes
        raise ConfigError(f"{path}: not valid Python ({e})") from None
    m = _Module(tree, source, path)
    lines = source.splitlines()
    found: dict[tuple[int, str], Finding] = {}
    for rule, check in CHECKS.items():
        for f in check(m):
            if not _suppressed(lines[f.line - 1] if f.line <= len(lines) else "", rule):
                found.setdefault((f.line, rule), f)
    return sorted(found.values(), key=lambda f: (f.line, f.col, f.rule))


SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "build", "dist"}


def python_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The files to scan: files as given, directories searched recursively for *.py (hidden and build
    directories skipped).

    Raises:
      ConfigError: a path that does not exist.
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
                files += [Path(root) / n for n in sorted(names) if n.endswith(".py")]
        else:
            raise ConfigError(f"{p}: no such file or directory; give Python files or directories to scan")
    return files


def scan_paths(paths: Sequence[str | os.PathLike]) -> ScanResult:
    """Scans files and directories (recursively, *.py) without running them.

    Raises:
      ConfigError: no paths, a missing path, a file that cannot be read as text or is not valid Python.
    """
    if not paths:
        raise ConfigError("nothing to scan; usage: jaxtrain scan PATH... (files or directories)")
    files = python_files(paths)
    findings: list[Finding] = []
    for file in files:
        try:
            source = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{file}: cannot read it as UTF-8 text ({e.__class__.__name__})") from None
        findings += scan_source(source, str(file))
    return ScanResult(tuple(map(str, files)), tuple(findings))
