"""The form decisions kept between runs, so that runs of one program on one machine compute alike.

The forms of a call (`choosers.StepForm`) round differently, so a run's numbers depend on the form
it chose; timed on a loaded machine, identical runs of one script and seed chose different forms
and ended 3.6e-4 apart in loss. A measured decision is therefore kept, beside the compiled programs
in the persistent compile cache when there is one (`compile_cache`; the directory JAX is given,
which the `jaxtrain` command turns on), else in the user's cache folder (`memory_dir`), and later
runs of the same program on the same machine reuse it without timing anything: their numbers no
longer depend on the load.

A decision is one small JSON file in that folder, named by the hash of its key: the
program (the hash of the scan call's lowered text, which holds its steps, shapes, dtypes and
shardings; the unrolled form's U) and the machine (backend, device kind and count, jax and jaxlib
versions, CPU count, XLA_FLAGS): another machine or version measures afresh. It is written
atomically (`safe_files.write_text`) and read through `safe_files.read_json_object`; a file that is
not what this module writes (corrupt, edited, another key's) is ignored with one note, measured
again and replaced. A form read from it is one of the forms every run can take; what it decides is
speed and rounding, never what is computed. `JAXTRAIN_FORM_MEMORY=off` keeps nothing (every
run measures; the test suite, whose runs would share decisions, sets it); `JAXTRAIN_FORM_MEMORY=DIR`
keeps them in DIR. Delete the folder to have the forms measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax

from jaxtrain._src import compile_cache
from jaxtrain._src.config import STEP_FORMS
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.report.notes import note
from jaxtrain._src.safe_files import read_json_object, write_text

__all__ = ["ENV", "FOLDER", "FormMemory", "machine", "memory_dir"]

ENV = "JAXTRAIN_FORM_MEMORY"
FOLDER = "jaxtrain-forms"
VERSION = 1  # of the file and of the decision's rule: a later rule measures afresh


def memory_dir() -> Path | None:
    """Where decisions are kept: `JAXTRAIN_FORM_MEMORY` when it names a folder (None when it is
    off: every run measures); else `jaxtrain-forms` in the persistent compile cache JAX was given
    (a local one); else `$XDG_CACHE_HOME/jaxtrain/forms` (`~/.cache/jaxtrain/forms`). Without a
    folder of their own, runs of one script from Python (no compile cache) would time the forms
    afresh, and a loaded machine ranks them otherwise: measured under two busy processes on 2 cores,
    runs of one seed chose scan, step, step (`jaxtrain bench sameseed`)."""
    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in ("0", "off", "false", "no"):
        return None
    if setting:
        return Path(setting)
    cache = _compile_cache_dir()
    if cache and "://" not in str(cache):  # a remote cache (gs://...) is not a folder of this machine
        return Path(cache) / FOLDER
    return compile_cache.default_dir().parent / "forms"


def _compile_cache_dir() -> str | None:
    """The persistent compile cache JAX was given (`compile_cache.enable_compile_cache`, or the user's)."""
    return jax.config.values.get("jax_compilation_cache_dir")


def machine() -> dict[str, Any]:
    """What of the machine a decision holds for: the timings behind it were taken there."""
    from importlib import metadata  # jaxlib's version, read without importing it (jax's dependency, not ours)

    device = jax.devices()[0]
    return {"backend": jax.default_backend(), "device": getattr(device, "device_kind", str(device)),
            "devices": jax.device_count(), "jax": jax.__version__, "jaxlib": metadata.version("jaxlib"),
            "cpus": os.cpu_count(), "xla_flags": os.environ.get("XLA_FLAGS", "")}


def fingerprint(program_text: str) -> str:
    """The hash of a lowered program's text: the program, whatever the run that traced it."""
    return hashlib.sha256(program_text.encode("utf-8")).hexdigest()


class FormMemory:
    """The decisions of one folder (`memory_dir()` by default); `key` says what one holds for."""

    def __init__(self, directory: Path):
        self.directory = directory

    @staticmethod
    def key(program: str, unroll: int) -> dict[str, Any]:
        """A decision's key: the scan call's `fingerprint`, the unrolled form's U, the machine."""
        return {"version": VERSION, "program": program, "unroll": unroll, **machine()}

    def _path(self, key: dict[str, Any]) -> Path:
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:32]
        return self.directory / f"{name}.json"

    def recall(self, key: dict[str, Any]) -> dict[str, Any] | None:
        """The decision kept for `key` ({"form", "why", "ms_per_step", ...}), or None: none kept,
        or a file that is not one this module wrote for `key` (one note; it is measured again)."""
        path = self._path(key)
        try:
            kept = read_json_object(path)
        except ConfigError as e:
            note(f"the kept form decision is ignored, the form measured again: {e}")
            return None
        if kept is None:
            return None
        decision = kept.get("decision")
        if (kept.get("key") != key or not isinstance(decision, dict)
                or decision.get("form") not in STEP_FORMS[1:] or not isinstance(decision.get("why"), str)
                or not isinstance(decision.get("ms_per_step"), dict)
                or not all(isinstance(t, (int, float)) for t in decision["ms_per_step"].values())):
            note(f"the kept form decision {path} is not one jaxtrain wrote for this program and machine (changed or "
                 "corrupt): ignored, the form is measured again and the file replaced")
            return None
        return decision

    def remember(self, key: dict[str, Any], decision: dict[str, Any]) -> None:
        """Keeps `decision` for `key`; a folder that cannot be written loses it (one note): the
        next run measures again."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_text(self._path(key), json.dumps({"key": key, "decision": decision}, indent=1, sort_keys=True))
        except (OSError, ConfigError) as e:
            note(f"the form decision could not be kept in {self.directory} ({getattr(e, 'strerror', None) or e}); "
                 "the next run measures it again")

