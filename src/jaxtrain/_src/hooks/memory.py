"""`MemoryHook`: where the process's resident memory went, in every run (`summary["memory"]`, the
final block: `report.memory_report`).

The process's high-water mark (the peak RSS a benchmark or the kernel reports) is read at the
boundaries of a run's phases, so each phase is charged with how much it raised the peak:

- before fit: the runtime, the imports and whatever the caller built (the model, the data passed in);
- setup & compile: the data and train state placed on the device, and compiling the programs
  (XLA's compiler holds 100-200 MiB while it works; `memory.release_free_heap` returns it after);
- training: the training calls' temporaries (activations kept for the backward pass among them);
- evaluation & checkpoints: what an epoch's end adds (evaluation calls, checkpoint buffers).

Beside the phases stand the sizes behind them: the training data on the device (and how much of it
is the caller's host arrays used in place, on a CPU), the train state, and each compiled program's
temporaries (XLA's memory analysis), and how the C heap keeps free memory (`memory.heap_setting`).
Where /proc is missing (not Linux), there is no memory section.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.memory import heap_setting, process_memory
from jaxtrain._src.report.memory_report import PHASES

__all__ = ["MemoryHook"]


class MemoryHook(RunHook):
    """Reads the process's memory at each phase's end; adds `summary["memory"]` (`memory_summary`).

    Made when `fit` starts (its first reading is the memory the caller brought) and put first among
    the hooks, so that an epoch's end is read before evaluation and checkpoints run.
    """

    def __init__(self) -> None:
        self._readings: list[tuple[str, dict[str, int]]] = []
        self._mark("before fit")
        self._phase_open = "setup & compile"

    def _mark(self, phase: str) -> None:
        reading = process_memory()
        if reading is not None:
            self._readings.append((phase, reading))

    def on_start(self, run: Run) -> None:
        self._mark("setup & compile")
        self._phase_open = "training"

    def on_epoch_start(self, run: Run) -> None:
        if self._phase_open == "evaluation & checkpoints":
            self._mark("evaluation & checkpoints")
        self._phase_open = "training"

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        self._mark("training")
        self._phase_open = "evaluation & checkpoints"

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        self._mark(self._phase_open)
        if len(self._readings) < 2:
            return
        summary["memory"] = memory_summary(self._readings, run)


def memory_summary(readings: list[tuple[str, dict[str, int]]], run: Run) -> dict[str, Any]:
    """The JSON-ready memory section: the peak, how much each phase raised it, and the sizes."""
    raised = dict.fromkeys(PHASES, 0)
    peak = readings[0][1]["peak"]
    for phase, reading in readings[1:]:
        raised[phase] += max(reading["peak"] - peak, 0)
        peak = max(peak, reading["peak"])
    programs: dict[str, int] = {}
    for entry in run.calls.compiles:
        if entry.get("temp_bytes") is not None:
            name = f"{entry['what']} (K={entry['k']})" if "k" in entry else entry["what"]
            programs[name] = max(programs.get(name, 0), entry["temp_bytes"])
    return {
        "peak_rss_bytes": peak,
        "start_rss_bytes": readings[0][1]["rss"],
        "start_peak_bytes": readings[0][1]["peak"],
        "raised_bytes": raised,
        "data_device_bytes": getattr(run.feed, "device_bytes", 0),
        "data_in_place_bytes": getattr(run.feed, "in_place_bytes", 0),
        "platform": run.device.platform,
        "state_bytes": sum(x.nbytes for x in jax.tree.leaves(run.state)),
        "program_temp_bytes": programs,
        "heap": heap_setting(),
    }
