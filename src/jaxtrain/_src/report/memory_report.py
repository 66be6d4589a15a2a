"""The memory section of the final block: `summary["memory"]` (`hooks.memory.MemoryHook`) as text."""

from __future__ import annotations

from typing import Any

from jaxtrain._src.memory import format_bytes

PHASES = ("before fit", "setup & compile", "training", "evaluation & checkpoints")
IN_PLACE_HINT = "on a CPU, arrays made with jaxtrain.data.aligned_empty are used in place"


def memory_lines(m: dict[str, Any]) -> list[str]:
    """The memory section as text lines: the peak, what each phase added to it and why, and the
    temporaries of each compiled program."""
    copied = m["data_in_place_bytes"] < m["data_device_bytes"] and m["platform"] == "cpu"
    why = {
        "before fit": f"runtime, imports, the caller's model and data ({format_bytes(m['start_rss_bytes'])} resident)",
        "setup & compile": f"data on the device {_data(m)}{' *' if copied else ''}, train state "
                           f"{format_bytes(m['state_bytes'])}, compiling",
        "training": "the training calls' temporaries",
        "evaluation & checkpoints": "evaluation calls, checkpoint buffers",
    }
    lines = [f"MEMORY: peak resident {format_bytes(m['peak_rss_bytes'])}, raised by each phase"]
    lines.append(f"  {'before fit':<25}{format_bytes(m['start_peak_bytes']):>11}  {why['before fit']}")
    for phase in PHASES[1:]:
        lines.append(f"  {phase:<25}{'+' + format_bytes(m['raised_bytes'][phase]):>11}  {why[phase]}")
    if m["program_temp_bytes"]:
        lines.append("  temporaries: " + ", ".join(f"{name} {format_bytes(n)}"
                                                   for name, n in m["program_temp_bytes"].items()))
    if m.get("heap"):
        lines.append(f"  C heap: {m['heap']}")
    if copied:
        lines.append(f"  * a copy of the host arrays: {IN_PLACE_HINT}")
    return lines


def _data(m: dict[str, Any]) -> str:
    size, shared = format_bytes(m["data_device_bytes"]), m["data_in_place_bytes"]
    if not m["data_device_bytes"] or not shared:
        return size
    if shared >= m["data_device_bytes"]:
        return f"{size} (the host arrays, used in place)"
    return f"{size} ({format_bytes(shared)} of it the host arrays, used in place)"
