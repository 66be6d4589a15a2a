"""Orbax checkpoints of the whole `TrainState`, with the loop's position and history beside it.

A checkpoint is a step directory under `<run dir>/checkpoints/` holding the item `state`, the
`TrainState` flattened to `{path: array}` (so names and shapes can be checked on restore), and,
as the step's custom metadata, JSON with the format version, the step, the chosen K, the
history so far and the running sums of the current epoch. Orbax writes each step to a temporary directory and renames
it when complete, so a process killed mid-save leaves no checkpoint that `latest_step` would pick.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxtrain.errors import JaxtrainError
from jaxtrain.loop_state import FORMAT_VERSION
from jaxtrain.state import TrainState


class CheckpointError(JaxtrainError):
    """A checkpoint that cannot be written or restored (exit code 2)."""


def _flatten(tree: Any) -> dict[str, Any]:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def flatten_state(state: TrainState) -> dict[str, jax.Array]:
    """`{path: array}` for every leaf of `state`; the PRNG key is stored as its raw uint32 data."""
    return _flatten(state._replace(rng=jax.random.key_data(state.rng)))


def _unflatten_checked(template: Any, expected: dict[str, Any], flat: dict[str, Any]) -> Any:
    """`template`'s structure filled from `flat`, checked name by name and shape by shape against `expected`."""
    missing, extra = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"the checkpoint holds other variables than this model (missing {missing[:3]}, unexpected {extra[:3]}); "
            "it was written by another model or config"
        )
    for name, leaf in expected.items():
        shape = tuple(getattr(leaf, "shape", None) or np.shape(leaf))  # arrays or abstract (eval_shape) leaves
        if tuple(np.shape(flat[name])) != shape:
            raise CheckpointError(
                f"checkpoint variable {name} has shape {tuple(np.shape(flat[name]))} but this config builds "
                f"{shape}; resume with the config the run was started with"
            )
    return jax.tree.unflatten(jax.tree.structure(template), [flat[name] for name in expected])


def unflatten_state(template: TrainState, flat: dict[str, Any]) -> TrainState:
    """The inverse of `flatten_state`, checked leaf by leaf against `template`.

    Raises:
      CheckpointError: when names or shapes differ (the checkpoint is of another model or config).
    """
    raw = template._replace(rng=jax.random.key_data(template.rng))
    restored = _unflatten_checked(raw, _flatten(raw), flat)
    return restored._replace(rng=jax.random.wrap_key_data(restored.rng, impl=jax.random.key_impl(template.rng)))


class _StderrSilencer:
    """Points file descriptor 2 at /dev/null until `restore` (native code writes there directly)."""

    def __init__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def restore(self) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)


def _os_reason(error: Exception) -> str:
    """The OS reason inside an orbax/tensorstore error ("No space left on device"), else its first line."""
    code = re.search(r"os_error_code='?(\d+)", str(error))
    if code:
        return os.strerror(int(code.group(1)))
    return getattr(error, "strerror", None) or str(error).splitlines()[0][:200]


class Checkpointer:
    """Saves and restores checkpoints in `directory`; keeps the last `keep_last` and the
    `keep_best` with the best `best_metric` (lowest when `best_mode` is min)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        keep_last: int = 3,
        keep_best: int = 1,
        best_metric: str = "val_loss",
        best_mode: str = "min",
        read_only: bool = False,
    ):
        self.directory = Path(directory).absolute()
        self._silencer: _StderrSilencer | None = None
        self.best_metric, self.best_mode = best_metric, best_mode
        policies = ocp.checkpoint_managers
        keep = [policies.LatestN(n=keep_last)]
        if keep_best:
            keep.append(policies.BestN(get_metric_fn=lambda m: m[best_metric], reverse=best_mode == "min", n=keep_best,
                                       keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(  # a reader never creates, deletes or cleans up
            preservation_policy=None if read_only else policies.AnyPreservationPolicy(keep),
            enable_async_checkpointing=not read_only,
            create=not read_only,
            cleanup_tmp_directories=not read_only,
        )
        try:
            self._manager = ocp.CheckpointManager(self.directory, options=options,
                                                  item_handlers={"state": ocp.StandardCheckpointHandler()})
        except OSError as e:
            raise CheckpointError(f"cannot open checkpoint directory {self.directory}: {e.strerror or e}") from None

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The kept step with the best metric, or the latest when none has the metric."""
        scored = []
        for step in self.steps():
            value = self.read_meta(step).get("metrics", {}).get(self.best_metric)
            if value is not None:
                scored.append((value if self.best_mode == "min" else -value, step))
        return min(scored)[1] if scored else self.latest_step()

    def save(self, step: int, state: TrainState, meta: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        """Starts an asynchronous save (returns once the arrays are copied off the device).

        Raises:
          CheckpointError: when this or an earlier save could not be written.
        """
        flat = flatten_state(state)
        self._preflight(sum(x.nbytes for x in flat.values()))
        # A deep copy: the save is asynchronous and the caller keeps changing its dicts and lists.
        meta = json.loads(json.dumps({"format": FORMAT_VERSION, **meta, "step": step, "metrics": metrics or {}}))
        args = ocp.args.Composite(state=ocp.args.StandardSave(flat))
        scores = {k: v for k, v in (metrics or {}).items() if v is not None} or None
        self._guard(lambda: self._manager.save(step, args=args, metrics=scores, force=True, custom_metadata=meta))

    def _preflight(self, nbytes: int) -> None:
        """Fails before orbax starts writing when the directory is read-only or lacks the space:
        a write that fails inside orbax's threads is reported only later, and noisily."""
        probe = self.directory / f".write-test-{jax.process_index()}"
        try:
            probe.write_bytes(b"0")
            probe.unlink()
            free = shutil.disk_usage(self.directory).free
        except OSError as e:
            self._fail(e.strerror or str(e))
        if free < nbytes + (1 << 20):  # the arrays, plus room for metadata
            self._fail(f"No space left on device (a checkpoint needs about {nbytes / 2**20:.1f} MiB, "
                       f"{free / 2**20:.1f} MiB free)")

    def wait(self) -> None:
        """Blocks until pending saves are on disk; raises CheckpointError if one failed."""
        self._guard(self._manager.wait_until_finished)

    def read_meta(self, step: int) -> dict[str, Any]:
        return dict(self._manager.metadata(step).custom_metadata or {})

    def read(self, step: int | None = None, shardings: dict[str, Any] | None = None
             ) -> tuple[dict[str, jax.Array], dict[str, Any]]:
        """`({path: array}, meta)` of checkpoint `step` (the latest by default), unchecked.

        Each array is placed with `shardings[path]` when given, else on this process's first
        device: a checkpoint restores onto any mesh, whichever mesh wrote it.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no complete checkpoint in {self.directory}")
        if step not in self.steps():
            raise CheckpointError(f"no checkpoint at step {step} in {self.directory}; it has steps {self.steps()}")
        meta = self.read_meta(step)
        if meta.get("format", 0) > FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint step {step} has format {meta['format']}, newer than this jaxtrain reads "
                f"({FORMAT_VERSION}); upgrade jaxtrain"
            )
        try:
            saved = self._manager.item_metadata(step)["state"]
            default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            target = {path: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=(shardings or {}).get(path, default))
                      for path, m in saved.items()}
            restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
        except Exception as e:  # noqa: BLE001 - orbax raises many types for unreadable data
            raise CheckpointError(f"cannot read checkpoint step {step} in {self.directory}: {e}") from None
        return dict(restored["state"]), meta

    def restore(self, template: TrainState, step: int | None = None, shardings: Any = None
                ) -> tuple[TrainState, dict[str, Any]]:
        """The state and meta of checkpoint `step` (the latest by default), checked against `template`
        and placed with `shardings` (a pytree like `template`; default: this process's first device)."""
        flat, meta = self.read(step, _flatten(shardings) if shardings is not None else None)
        return unflatten_state(template, {k: jax.numpy.asarray(v) for k, v in flat.items()}), meta

    def restore_model(self, params: Any, model_state: Any, step: int | None = None) -> tuple[Any, Any]:
        """Only the model's variables of checkpoint `step`, checked against templates of
        `(params, model_state)`: no optimizer is needed to rebuild them."""
        flat, _ = self.read(step)
        template = TrainState(None, params, model_state, None, None)
        wanted = {path: leaf for path, leaf in _flatten(template).items()}
        picked = {path: flat[path] for path in wanted if path in flat}
        restored = _unflatten_checked(template, wanted, picked)
        return restored.params, restored.model_state

    def close(self) -> None:
        try:
            self._manager.close()
        except Exception:  # noqa: BLE001 - a failed pending save was already reported
            pass
        if self._silencer:
            self._silencer.restore()
            self._silencer = None

    def _guard(self, action) -> Any:
        try:
            return action()
        except Exception as e:  # noqa: BLE001 - orbax wraps OSErrors from its writer threads
            # After a failed write, orbax's storage threads print tracebacks of it from native
            # callbacks until the manager is closed; this error reports it once, in one line.
            self._silencer = self._silencer or _StderrSilencer()
            self._fail(_os_reason(e))

    def _fail(self, reason: str) -> None:
        last = self.latest_step()
        raise CheckpointError(
            f"cannot write a checkpoint to {self.directory}: {reason}; free space or choose another --run-dir "
            f"(the last complete checkpoint is {'step ' + str(last) if last is not None else 'none'})"
        )
