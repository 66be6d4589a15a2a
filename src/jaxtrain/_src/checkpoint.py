"""Orbax checkpoints of the whole `TrainState`, with the loop's position and history beside it.

A checkpoint is a step directory under `<run dir>/checkpoints/` holding the item `state`, the
`TrainState` flattened to `{path: array}` (so names and shapes can be checked on restore) plus,
for a feed that holds data it makes during the run (a replay buffer), its arrays under `feed:`
paths, and,
as the step's custom metadata, JSON with the format version, the step, the chosen K, the
history so far and the running sums of the current epoch. Orbax writes each step to a temporary directory and renames
it when complete, so a process killed mid-save leaves no checkpoint that `latest_step` would pick.

A complete step can still be unreadable later (a truncated or deleted file, a full disk at the
wrong moment, a bad copy). Reading "the latest" or "the best" then falls back to the next step
that reads, with a note naming the step skipped and why; a writer moves the skipped step
directory aside (`<step>.unreadable-<unix time>`, a name orbax neither lists nor deletes) so that
it can save that step number again.

A step can also read without error and still hold other values than were saved (a flipped bit
on disk or in a copy that the compression does not catch). Each save stores a checksum of every
array in the metadata (`checksums`: a CRC-32 of the bytes of arrays on the host, a CPU device's;
for arrays on an accelerator a checksum computed on the device by one compiled program, so a save
copies nothing more to the host); every read recomputes them and treats a mismatch like an
unreadable file: the step is skipped with one note. Steps saved before checksums read unchecked.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jaxtrain._src.errors import JaxtrainError, argument
from jaxtrain._src.loop_state import FORMAT_VERSION
from jaxtrain._src.report import notes
from jaxtrain._src.safe_files import probe_writable
from jaxtrain._src.state import TrainState


class CheckpointError(JaxtrainError):
    """A checkpoint that cannot be written or restored (exit code 2)."""


def _flatten(tree: Any) -> dict[str, Any]:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _average_as_params(flat: dict[str, Any], params: list[str]) -> dict[str, Any]:
    """The average of the weights in a checkpoint's optimizer state (`optim.with_ema`), under the
    parameters' own paths."""
    out = {}
    for path in params:
        suffix = ".average" + path[len(".params"):]
        found = [k for k in flat if k.startswith(".opt_state") and k.endswith(suffix)]
        if len(found) != 1:
            raise CheckpointError("the checkpoint holds no average of the weights: the run was trained without "
                                  f"{argument('ema')}; use the raw weights")
        out[path] = flat[found[0]]
    return out


def _is_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def _raw_keys(tree: Any) -> Any:
    """`tree` with each typed PRNG key (the run's key, a model's `nnx.Rngs` streams) as its raw
    uint32 data, which NumPy, checksums and Orbax read like any array; abstract keys
    (`jax.ShapeDtypeStruct`, from `nnx.eval_shape`) become the data's shape."""
    def raw(x: Any) -> Any:
        if not _is_key(x):
            return x
        return jax.random.key_data(x) if isinstance(x, jax.Array) else jax.eval_shape(jax.random.key_data, x)

    return jax.tree.map(raw, tree)


def _typed_keys(template: Any, tree: Any) -> Any:
    """The inverse of `_raw_keys`: the leaves of `tree` where `template` has a typed key wrapped
    back as keys of the template's implementation (threefry, rbg, ...)."""
    def typed(t: Any, x: Any) -> Any:
        if not _is_key(t):
            return x
        impl = jax.random.key_impl(t if isinstance(t, jax.Array) else jnp.zeros((), t.dtype))
        return jax.random.wrap_key_data(jnp.asarray(x), impl=impl)

    return jax.tree.map(typed, template, tree)


def flatten_state(state: TrainState) -> dict[str, jax.Array]:
    """`{path: array}` for every leaf of `state`; PRNG keys (the run's, and any the model holds)
    are stored as their raw uint32 data under their own paths."""
    return _flatten(_raw_keys(state))


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


FEED = "feed:"  # prefix of the paths of a feed's arrays


def flatten_feed(arrays: Any) -> dict[str, Any]:
    """`{"feed:" + path: array}` for a feed's arrays (a pytree; None has none)."""
    return {FEED + path: leaf for path, leaf in _flatten(arrays).items()} if arrays is not None else {}


def unflatten_state(template: TrainState, flat: dict[str, Any]) -> TrainState:
    """The inverse of `flatten_state`, checked leaf by leaf against `template`.

    Raises:
      CheckpointError: when names or shapes differ (the checkpoint is of another model or config).
    """
    raw = _raw_keys(template)
    return _typed_keys(template, _unflatten_checked(raw, _flatten(raw), flat))


def _mix(h: jax.Array) -> jax.Array:
    """MurmurHash3's finaliser: a bijection of uint32 in which every input bit moves every output bit."""
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _checksum_one(x: jax.Array) -> jax.Array:
    """Two uint32 sums of a mix of each element's bits with its position: any changed element, or
    values moved to other positions, change both (one pass over the array: ~35 ms for 48 MiB on
    a CPU, microseconds on a GPU). Integer sums wrap and
    commute, so the result is exact whatever the sharding or reduction order."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    bits = jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[size])
    bits = bits.astype(jnp.uint32)
    index = jnp.zeros(bits.shape, jnp.uint32)
    for axis in range(bits.ndim):  # the flat position, built per axis (no reshape of a sharded array)
        stride = int(np.prod(bits.shape[axis + 1:], dtype=np.int64)) & 0xFFFFFFFF
        index = index + jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * jnp.uint32(stride)
    mixed = _mix(bits ^ (index * jnp.uint32(0x9E3779B9)))  # for each position, a bijection of the bits
    # A changed element changes `mixed` there, so both sums (the second weighted by an odd number).
    sums = [jnp.sum(mixed, dtype=jnp.uint32), jnp.sum(mixed * (2 * index + 1), dtype=jnp.uint32)]
    return jnp.stack(sums)


@jax.jit
def _checksums_on_device(flat: dict[str, Any]) -> dict[str, jax.Array]:
    return {k: _checksum_one(v) for k, v in flat.items()}


def is_on_host(x: Any) -> bool:
    """Whether `x` is a NumPy value or a whole array on a CPU device (read without a copy)."""
    return isinstance(x, (np.ndarray, np.generic)) or (
        getattr(x, "is_fully_addressable", False) and all(d.platform == "cpu" for d in x.devices()))


def _crc32(x: Any) -> str:
    """`crc32:` and the CRC-32 of the array's bytes in row-major order (zlib: about 0.5 ms a MiB on
    a CPU, no compile), for arrays already on the host."""
    data = np.ascontiguousarray(np.asarray(x))
    return f"crc32:{zlib.crc32(data.reshape(-1).view(np.uint8).data):08x}"


def checksum_program() -> Callable[[dict[str, Any]], dict[str, jax.Array]]:
    """The function a save runs on the device, for compiling it ahead (its first compile takes
    about a second on a CPU: a run compiles it in the background before its first save)."""
    return _checksums_on_device


def checksums(flat: dict[str, Any], program: Callable | None = None, on_host: bool | None = None
              ) -> dict[str, str]:
    """`{path: checksum}` of each array's values. Arrays on the host (a CPU device) get a CRC-32
    of their bytes (`crc32:` and 8 hex digits: no compile, faster than a program on a CPU); the
    others `_checksum_one`'s 16 hex digits, computed where they live by one compiled program
    (`program`, the compiled `checksum_program()`, when given), so only the checksums come to the
    host. `on_host` forces one way for every array (None: each array as it is)."""
    host = {k for k, v in flat.items() if (on_host if on_host is not None else is_on_host(v))}
    out = {k: _crc32(flat[k]) for k in host}
    device = {k: v for k, v in flat.items() if k not in host}
    if device:
        sums = jax.device_get((program or _checksums_on_device)(device))
        out |= {k: f"{int(v[0]):08x}{int(v[1]):08x}" for k, v in sums.items()}
    return out


def _ignore_closed_loop_callbacks() -> None:
    """After a failed save, tensorstore's threads still complete orbax's futures into event loops
    orbax has closed, and each `RuntimeError: Event loop is closed` is printed, through
    `sys.excepthook` or as an unraisable exception with no object, even after the manager is
    closed, and in about 1 run in 8 before the next save reports the failure: those, and only
    those, are dropped for the rest of the process, so the failure stays one line. Installed by
    every writing manager."""
    if getattr(sys.excepthook, "_jaxtrain_closed_loop", False):
        return

    def closed_loop(value: BaseException | None) -> bool:
        return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"

    previous, previous_unraisable = sys.excepthook, sys.unraisablehook

    def hook(kind: type, value: BaseException, tb: Any) -> None:
        if not closed_loop(value):
            previous(kind, value, tb)

    def unraisable(info: Any) -> None:
        if not closed_loop(info.exc_value):
            previous_unraisable(info)

    hook._jaxtrain_closed_loop = True  # type: ignore[attr-defined]  # a mark on the function: installed once
    sys.excepthook, sys.unraisablehook = hook, unraisable


class _UnscoredSave(logging.Filter):
    """Drops Orbax's warning that a save came without the best metric ("Requested `tracked_metric`;
    did not provide metrics."): a run without validation data keeps its latest checkpoints
    unscored, as it should, and Orbax said so at every save, `verbosity="silent"` or not."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "did not provide metrics" not in record.getMessage()


def _quiet_unscored_saves() -> None:
    absl = logging.getLogger("absl")  # Orbax has imported absl.logging, whose logger this is
    if not any(isinstance(f, _UnscoredSave) for f in absl.filters):
        absl.addFilter(_UnscoredSave())


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


_REASON_CHARS = 150
_STATUS = re.compile(r"^[A-Z_]+: ")  # an absl status code, how tensorstore's errors begin


def _its_file(path: str | os.PathLike) -> str:
    return f"its {'data file' if '/d/' in f'/{path}' else 'file'} {path}"


def _os_reason(error: BaseException, root: Path | None = None) -> str:
    """A short one-line reason inside an orbax/tensorstore error: the OS reason ("No space left on
    device"), and, reading a checkpoint at `root`, which file or array is truncated, missing or
    corrupt; else the error's first line.

    Orbax wraps tensorstore's error in its own (with a 2,000-character spec), so the innermost
    error of the chain that carries a status code is read; paths under `root` are shown relative.
    """
    chain = [error]
    while len(chain) < 8 and (parent := chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(parent)
    inner = next((e for e in reversed(chain) if _STATUS.match(str(e))), error)
    text = re.sub(r"\s*\[tensorstore_spec=.*", "", str(inner), flags=re.S).strip()
    text = (text.splitlines() or [type(inner).__name__])[0]
    text = text.replace("\\'", "'")  # tensorstore escapes the quotes in array names
    if root is not None:
        text = text.replace(f"{root}/", "")
    files = [f for f in re.findall(r'local file "([^"]+)"', text) if not f.endswith("/")]
    array = re.search(r'(?:Error reading|Metadata at) "(.+?)/[^/"]*" in OCDBT database', text)
    where = _its_file(files[-1]) if files else f"the data of array {array.group(1)}" if array else None
    for e in chain:
        code = re.search(r"os_error_code='?(\d+)", str(e))
        os_error = os.strerror(int(code.group(1))) if code else getattr(e, "strerror", None)
        if os_error:
            name = getattr(e, "filename", None)
            if root is not None and name and not where:
                where = _its_file(Path(name).relative_to(root) if Path(name).is_relative_to(root) else name)
            return f"{where}: {os_error}" if root is not None and where else os_error
    truncated = re.search(r"byte range \[\d+, (\d+)\) is not valid for value of size (\d+)", text)
    if truncated:
        needed, size = truncated.groups()
        if not files and root is not None:  # tensorstore names the array; its data file has that size
            same = [p for p in root.glob("**/d/*") if p.is_file() and p.stat().st_size == int(size)]
            where = _its_file(same[0].relative_to(root)) if len(same) == 1 else where
        return f"{where or 'a data file'} is truncated: {size} bytes, {needed} needed"
    if where and (text.startswith("NOT_FOUND") or "does not exist" in text):
        return f"{where} is missing"
    if where:
        detail = text.split('": ')[-1].split("; at ")[0]
        return f"{where} is corrupt: {detail}"[:_REASON_CHARS]
    return _STATUS.sub("", text)[:_REASON_CHARS]


def _check_values(step_dir: Path) -> None:
    """Reads every value stored in the step's item once, synchronously.

    Orbax reads arrays concurrently in an asyncio loop: when one read fails, tensorstore's
    callbacks for the others land on the closed loop and print tracebacks after the error has
    been raised. A damaged step fails here instead, quietly, and on every process of a job alike
    (each reads all files, not only its shards), so that all of them skip the same steps. It
    costs about a tenth of the restore (45 MiB: 0.05 s of 0.4 s).

    Raises:
      _Unreadable: a file is missing, truncated or corrupt.
    """
    state = step_dir / "state"
    if not state.is_dir():  # orbax reports this as a KeyError
        raise _Unreadable("its state/ directory is missing")
    if not (state / "_METADATA").is_file():  # and this as metadata None
        raise _Unreadable("its state/_METADATA is missing")
    parsed = {}
    for path in [state / "_METADATA", state / "_sharding", *sorted(state.glob("array_metadatas/*"))]:
        try:  # orbax's JSON files, which its errors do not name
            parsed[path.name] = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError) as e:
            raise _Unreadable(f"its {path.relative_to(step_dir)} is not valid JSON: {getattr(e, 'msg', e)}") from None
    if not (isinstance(parsed["_METADATA"], dict) and parsed["_METADATA"].get("use_ocdbt")):
        return  # a layout without one database to list: orbax's read is the check
    if not (state / "manifest.ocdbt").is_file():  # tensorstore would open an empty database
        raise _Unreadable("its state/manifest.ocdbt is missing")
    try:
        import tensorstore as ts

        store = ts.KvStore.open({"driver": "ocdbt", "base": {"driver": "file", "path": f"{state}/"}}).result()
        keys = store.list().result()
        for start in range(0, len(keys), 16):  # a few reads in flight, a few values in memory
            for read in [store.read(key) for key in keys[start:start + 16]]:
                read.result()
    except Exception as e:  # noqa: BLE001 - tensorstore raises ValueError and others
        raise _Unreadable(_os_reason(e, step_dir)) from None


def _verify(flat: dict[str, Any], saved: dict[str, str] | None) -> None:
    """Raises _Unreadable when an array read differs from the checksum saved with it (None: a step
    saved before checksums, read unchecked)."""
    if not saved:
        return
    crc = {k for k in saved.keys() & flat.keys() if saved[k].startswith("crc32:")}
    read = checksums({k: flat[k] for k in crc}, on_host=True)  # a device array is copied to the host
    read |= checksums({k: flat[k] for k in saved.keys() & flat.keys() if k not in crc}, on_host=False)
    bad = sorted(k for k in saved.keys() & read.keys() if saved[k] != read[k])
    if bad:
        more = f" and {len(bad) - 1} other array{'s' if len(bad) > 2 else ''}" if len(bad) > 1 else ""
        raise _Unreadable(f"array {bad[0]}{more} read other values than were saved (checksum mismatch): "
                          "its data files are corrupt")


class _Unreadable(Exception):
    """A complete checkpoint step whose files cannot be read; the message is the short reason."""


def _steps_text(steps: list[int]) -> str:
    """`[1, 2, 3]`, or for many steps `[1, 2, 3, ..., 98, 99, 100] (100 steps)`: one short line."""
    if len(steps) <= 8:
        return str(steps)
    return f"[{', '.join(map(str, steps[:3]))}, ..., {', '.join(map(str, steps[-3:]))}] ({len(steps)} steps)"


def _mib_tenths(nbytes: float, up: bool) -> int:
    """`nbytes` in tenths of a MiB, rounded up or down (so that shown sums and comparisons hold)."""
    tenths = nbytes * 10 / 2**20
    return int(-(-tenths // 1)) if up else int(tenths // 1)


_copy = jax.jit(lambda arrays: jax.tree.map(jnp.copy, arrays))
"""Copies of a dict of arrays, in one dispatch."""


def copies_for_writer(arrays: dict[str, jax.Array]) -> dict[str, Any]:
    """Copies of `arrays` that a save written beside the loop can keep while the next call donates
    the originals. On a CPU device, copies there (one dispatch; a host view of a buffer would block
    its donation). Off the CPU, NumPy copies on the host, fetched together (one transfer for all
    of them): the writer then checksums them with a CRC-32 and Orbax writes host arrays, where it
    would otherwise move each array off the device on its own (an H200 population of 16 members:
    1,056 such transfers for 48 saves). Arrays spread over other processes stay on their devices."""
    if all(is_on_host(x) for x in arrays.values()) or not all(x.is_fully_addressable for x in arrays.values()):
        return _copy(arrays)
    return jax.device_get(arrays)


class Checkpointer:
    """Saves and restores checkpoints in `directory`; keeps the last `keep_last` and the
    `keep_best` with the best `best_metric` (lowest when `best_mode` is min). With a `writer` (a
    thread shared by a population's members), a save copies the arrays (`copies_for_writer`) and
    hands the rest of the save to the writer: the loop goes on while P members' saves are written one
    after another beside it.

    Reading "the latest" or "the best" skips steps that cannot be read, each with one line to
    `note` (default: `note: ...` on stderr of process 0); `restored_step` is the step the last
    successful read used.
    """

    checksum_program: Callable | None = None
    """`checksum_program()` compiled for this run's arrays (`CheckpointHook` compiles it in the
    background at the start of a run); None compiles it at the first save."""

    def __init__(
        self,
        directory: str | os.PathLike,
        keep_last: int = 3,
        keep_best: int = 1,
        best_metric: str = "val_loss",
        best_mode: str = "min",
        read_only: bool = False,
        note: Callable[[str], None] | None = None,
        writer: Executor | None = None,
    ):
        self.directory = Path(directory).absolute()
        self._writer = writer
        self._writing: list[Future] = []  # the writes the writer thread has not finished
        self.read_only, self._note = read_only, note or notes.note
        self.restored_step: int | None = None
        self._silencer: _StderrSilencer | None = None
        self.best_metric, self.best_mode = best_metric, best_mode
        if not read_only:  # a failing save's callbacks can land before the failure is seen here
            _ignore_closed_loop_callbacks()
        import orbax.checkpoint as ocp  # ~0.2 s to import: loaded by the runs that checkpoint

        _quiet_unscored_saves()

        policies = ocp.checkpoint_managers
        keep = [policies.LatestN(n=keep_last)]
        if keep_best:
            keep.append(policies.BestN(get_metric_fn=lambda m: m[best_metric], reverse=best_mode == "min", n=keep_best,
                                       keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(  # a reader never creates, deletes or cleans up
            preservation_policy=None if read_only else policies.AnyPreservationPolicy(keep),
            enable_async_checkpointing=not read_only and writer is None,
            create=not read_only,
            cleanup_tmp_directories=not read_only,
            # Only with best_fn does orbax write each step's metrics to disk: without them a resumed
            # run's manager would see the earlier steps unscored, and BestN would delete the best.
            best_fn=(lambda m: m[best_metric]) if keep_best else None,
            best_mode=best_mode,
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
        """The kept step with the best metric, or the latest when none has the metric (steps whose
        metadata cannot be read are unranked)."""
        ranked = self._ranked()
        return ranked[0] if ranked else self.latest_step()

    def _ranked(self) -> list[int]:
        """The steps that have `best_metric`, best first; unreadable metadata ranks no step."""
        scored = []
        for step in self.steps():
            try:
                value = self._meta(step).get("metrics", {}).get(self.best_metric)
            except _Unreadable:
                continue
            if value is not None:
                scored.append((value if self.best_mode == "min" else -value, step))
        return [step for _, step in sorted(scored)]

    def save(self, step: int, state: TrainState, meta: dict[str, Any], metrics: dict[str, float] | None = None,
             feed: Any = None) -> None:
        """Starts an asynchronous save (returns once the arrays are copied off the device) of
        `state` and `feed`, the arrays of a feed that makes data during the run (or None).

        Raises:
          CheckpointError: when this or an earlier save could not be written.
        """
        flat = flatten_state(state) | flatten_feed(feed)
        # A deep copy: the save is asynchronous and the caller keeps changing its dicts and lists.
        meta = json.loads(json.dumps({"format": FORMAT_VERSION, **meta, "step": step, "metrics": metrics or {}}))
        if self._writer is None:
            self._write(step, flat, meta, metrics)
            return
        self._written()  # an earlier save's failure stops the run here
        flat = flat | copies_for_writer({k: v for k, v in flat.items() if isinstance(v, jax.Array)})
        self._writing.append(self._writer.submit(self._write, step, flat, meta, metrics))

    def _write(self, step: int, flat: dict[str, Any], meta: dict[str, Any], metrics: dict[str, float] | None) -> None:
        meta["checksums"] = checksums(flat, self.checksum_program)
        self._preflight(sum(x.nbytes for x in flat.values()), len(flat), len(json.dumps(meta)))
        import orbax.checkpoint as ocp

        args = ocp.args.Composite(state=ocp.args.StandardSave(flat))
        scores = {k: v for k, v in (metrics or {}).items() if v is not None} or None
        self._guard(lambda: self._manager.save(step, args=args, metrics=scores, force=True, custom_metadata=meta))

    def _written(self) -> None:
        """Waits for the saves handed to the writer (by the next save point, long written);
        raises the first one's failure."""
        writing, self._writing = self._writing, []
        for future in writing:
            future.result()

    def _preflight(self, nbytes: int, n_arrays: int, meta_bytes: int) -> None:
        """Fails before orbax starts writing when the directory is read-only or lacks the space:
        a write that fails inside orbax's threads is reported only later, and noisily."""
        try:
            probe_writable(self.directory)  # a fresh name, made exclusively: a planted link is never followed
            free = shutil.disk_usage(self.directory).free
        except OSError as e:
            self._fail(e.strerror or str(e))
        # Orbax writes a step into a temporary directory that it renames when complete, and deletes
        # older steps only after that, so the whole step must fit beside the existing ones. The
        # arrays are an upper bound (they are zstd-compressed); beyond them a step holds metadata:
        # `_METADATA`, `_sharding` and `array_metadatas/` (about 0.5 KiB per array), the OCDBT
        # manifest and b-tree nodes, `_CHECKPOINT_METADATA` (our meta as JSON), and some 25 files
        # and directories that take at least one 4 KiB block each (about 100 KiB for a tiny
        # model; 256 KiB leaves room for tensorstore's lock files and more processes).
        margin = (256 << 10) + 1024 * n_arrays + meta_bytes
        if free < nbytes + margin:
            arrays, extra = _mib_tenths(nbytes, up=True), _mib_tenths(margin, up=True)
            self._fail(f"not enough free space: a checkpoint needs about {arrays / 10:.1f} MiB of arrays + "
                       f"{extra / 10:.1f} MiB of metadata = {(arrays + extra) / 10:.1f} MiB, and "
                       f"{_mib_tenths(free, up=False) / 10:.1f} MiB is free")

    def wait(self) -> None:
        """Blocks until pending saves are on disk; raises CheckpointError if one failed."""
        self._written()
        self._guard(self._manager.wait_until_finished)

    def read_meta(self, step: int) -> dict[str, Any]:
        """The meta saved with checkpoint `step`.

        Raises:
          CheckpointError: its `_CHECKPOINT_METADATA` is missing or damaged.
        """
        try:
            return self._meta(step)
        except _Unreadable as e:
            raise CheckpointError(f"checkpoint step {step} in {self.directory} is unreadable ({e})") from None

    def _meta(self, step: int) -> dict[str, Any]:
        # Read as JSON here rather than with `CheckpointManager.metadata`, which also opens every
        # array (slow, and on a damaged step its tensorstore threads print tracebacks later).
        path = self.directory / str(step) / "_CHECKPOINT_METADATA"
        try:
            stored = json.loads(path.read_text())
        except FileNotFoundError:
            raise _Unreadable("its _CHECKPOINT_METADATA is missing") from None
        except json.JSONDecodeError as e:
            raise _Unreadable(f"its _CHECKPOINT_METADATA is not valid JSON: {e.msg}") from None
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or e
            raise _Unreadable(f"its _CHECKPOINT_METADATA cannot be read: {reason}") from None
        meta = stored.get("custom_metadata") if isinstance(stored, dict) else None
        if not meta:  # every save writes the format, step and metrics
            raise _Unreadable("its _CHECKPOINT_METADATA holds no jaxtrain metadata")
        return dict(meta)

    def read(self, step: int | str | None = None, shardings: dict[str, Any] | None = None
             ) -> tuple[dict[str, jax.Array], dict[str, Any]]:
        """`({path: array}, meta)` of checkpoint `step`, unchecked.

        `step` is a step number, `None` or `"latest"` (the newest step that reads), or `"best"`
        (the best by `best_metric` that reads, then the others newest first). Each step skipped
        gets one line to `note`; a writer moves it aside (see the module docstring).

        Each array is placed with `shardings[path]` when given, else on this process's first
        device: a checkpoint restores onto any mesh, whichever mesh wrote it.

        Raises:
          CheckpointError: no checkpoint, the step requested is absent or unreadable, no step
            reads, or a checkpoint of a newer format.
        """
        steps = self.steps()
        if not steps:
            raise CheckpointError(f"no complete checkpoint in {self.directory}")
        if step is not None and not isinstance(step, str):
            step = int(step)  # also a NumPy integer
        if isinstance(step, int):
            if step not in steps:
                raise CheckpointError(f"no checkpoint at step {step} in {self.directory}; it has steps "
                                      f"{_steps_text(steps)}")
            try:
                flat, meta = self._read_step(step, shardings)
            except _Unreadable as e:
                others = [s for s in steps if s != step]
                raise CheckpointError(f"checkpoint step {step} in {self.directory} is unreadable ({e}); "
                                      f"{'other steps: ' + _steps_text(others) if others else 'no other step'}"
                                      ) from None
            self.restored_step = step
            return flat, meta
        if step is None or step == "latest":
            order = steps[::-1]
        elif step == "best":
            ranked = self._ranked()
            order = ranked + [s for s in reversed(steps) if s not in ranked]
        else:
            raise CheckpointError(f"checkpoint step={step!r} must be a step number, 'best' or 'latest'")
        skipped: list[tuple[int, str]] = []
        for candidate in order:
            try:
                flat, meta = self._read_step(candidate, shardings)
            except _Unreadable as e:
                skipped.append((candidate, str(e)))
                continue
            self._skip(skipped, candidate)
            self.restored_step = candidate
            return flat, meta
        raise CheckpointError(f"no checkpoint in {self.directory} can be read (tried steps {_steps_text(order)}); "
                              f"step {skipped[0][0]}: {skipped[0][1]}")

    def _read_step(self, step: int, shardings: dict[str, Any] | None) -> tuple[dict[str, jax.Array], dict[str, Any]]:
        """Checkpoint `step` read whole.

        Raises:
          _Unreadable: a file of it is missing, truncated or corrupt.
          CheckpointError: it has a newer format than this jaxtrain reads.
        """
        meta = self._meta(step)
        if meta.get("format", 0) > FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint step {step} has format {meta['format']}, newer than this jaxtrain reads "
                f"({FORMAT_VERSION}); upgrade jaxtrain"
            )
        step_dir = self.directory / str(step)
        _check_values(step_dir)
        try:
            saved = self._manager.item_metadata(step)["state"]
            default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            target = {path: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=(shardings or {}).get(path, default))
                      for path, m in saved.items()}
            import orbax.checkpoint as ocp

            restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
        except Exception as e:  # noqa: BLE001 - orbax raises many types for unreadable data
            raise _Unreadable(_os_reason(e, step_dir)) from None
        flat = dict(restored["state"])
        _verify(flat, meta.get("checksums"))
        return flat, meta

    def _skip(self, skipped: list[tuple[int, str]], used: int) -> None:
        """Notes each skipped step; a writer moves them aside first, so that a later save of the
        same step number does not collide with them (process 0 renames, every process reloads)."""
        moved: dict[int, str] = {}
        if skipped and not self.read_only:
            self.wait()  # no save in flight while the directory changes under the manager
            if jax.process_index() == 0:
                for step, _ in skipped:
                    aside = self.directory / f"{step}.unreadable-{int(time.time())}"
                    try:
                        os.rename(self.directory / str(step), aside)
                        moved[step] = f"moved to {self.directory.name}/{aside.name}"
                    except OSError as e:
                        moved[step] = f"could not move it aside: {e.strerror or e}"
            if jax.process_count() > 1:
                multihost_utils.sync_global_devices("jaxtrain: unreadable checkpoints moved aside")
            self._manager.reload()  # forgets the moved steps
        for step, reason in skipped:
            self._note(f"checkpoint step {step} is unreadable ({reason}); "
                       f"{moved[step] + '; ' if step in moved else ''}using step {used}")

    def restore(self, template: TrainState, step: int | str | None = None, shardings: Any = None
                ) -> tuple[TrainState, dict[str, Any]]:
        """The state and meta of checkpoint `step` (as `read`: the latest that reads by default),
        checked against `template` and placed with `shardings` (a pytree like `template`; default:
        this process's first device)."""
        state, _, meta = self.restore_with_feed(template, None, step, shardings)
        return state, meta

    def restore_with_feed(self, template: TrainState, feed: Any, step: int | str | None = None,
                          shardings: Any = None) -> tuple[TrainState, Any, dict[str, Any]]:
        """`(state, feed arrays, meta)` of checkpoint `step`, as `restore`; the feed's arrays are
        checked against `feed` (a pytree of arrays, or None for a feed that saves none) and stay
        on this process's first device."""
        flat, meta = self.read(step, _flatten(shardings) if shardings is not None else None)
        flat = {k: jax.numpy.asarray(v) for k, v in flat.items()}
        feed_flat = {k: flat.pop(k) for k in [k for k in flat if k.startswith(FEED)]}
        state = unflatten_state(template, flat)
        if feed is None:
            if feed_flat:
                raise CheckpointError("the checkpoint holds a replay feed's arrays but this run has no such feed; "
                                      "it was written by another workload")
            return state, None, meta
        return state, _unflatten_checked(feed, flatten_feed(feed), feed_flat), meta

    def restore_model(self, params: Any, model_state: Any, step: int | str | None = None,
                      weights: str = "raw") -> tuple[Any, Any]:
        """Only the model's variables of checkpoint `step` (as `read`; `restored_step` says which
        step), checked against templates of `(params, model_state)`: no optimizer is needed.
        `weights="ema"` takes the parameters from the average of the weights the optimizer state
        holds (`TrainConfig.ema`) instead."""
        flat, _ = self.read(step)
        template = TrainState(None, params, model_state, None, None)  # type: ignore[arg-type]  # None: no leaves
        raw = _raw_keys(template)
        wanted = _flatten(raw)
        if weights == "ema":
            flat = {**flat, **_average_as_params(flat, [p for p in wanted if p.startswith(".params")])}
        picked = {path: flat[path] for path in wanted if path in flat}
        restored = _typed_keys(template, _unflatten_checked(raw, wanted, picked))
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
            self._fail(_os_reason(e))  # reported once, in one line

    def _fail(self, reason: str) -> None:
        # A save refused or failed for want of space: orbax's storage threads may print tracebacks
        # of the earlier step's write from native callbacks until the manager is closed.
        self._silencer = self._silencer or _StderrSilencer()
        _ignore_closed_loop_callbacks()
        last = self.latest_step()
        raise CheckpointError(
            f"cannot write a checkpoint to {self.directory}: {reason}; free space or choose another "
            f"{argument('run_dir')} (the last complete checkpoint is "
            f"{'step ' + str(last) if last is not None else 'none'})",
            directory=self.directory, last_step=last,
        )
