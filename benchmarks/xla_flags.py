"""`jaxtrain bench xla-flags`: XLA:CPU options against no options, on jaxtrain's compiled training call.

JAX reads XLA_FLAGS once per process, so each (repetition, setting) is a fresh process
(`python -m benchmarks.xla_flags --child`) whose XLA_FLAGS is exactly the setting's flags (empty
for the baseline; the parent's own XLA_FLAGS is not passed on). The child trains each workload through
`fit` as `bench profile` does (`profile.recipe_config`: char-gpt baby, mnist-cnn, mlp-regression; K
steps fused in one compiled call, fixed K so that every setting runs the same program) and times
every call after the first (compiling) one and `--warmup` more: ms per step is the median of those
calls. Repetitions are interleaved: each repetition runs every setting once, in an order rotated by
one per repetition, so that other work on a shared machine falls on all settings alike. Each
workload's compile seconds (`fit`'s `compile_time_s`; the children use no persistent cache) are
reported beside its step time: an option can trade one for the other.

A setting is "faster" on a workload only when its slowest repetition beats the baseline's fastest,
and the per-repetition ratios (setting / baseline of the same repetition) are all below 1; "slower"
the mirror image; otherwise "no clear difference".
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.child import child_main, run_child
from jaxtrain._src.errors import ConfigError

WORKLOADS = ("mlp-regression", "mnist-cnn", "char-gpt")
_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="  # jaxlib 0.10.2's default list is individual_dot
SETTINGS: dict[str, str] = {  # name -> XLA_FLAGS; every flag exists in jaxlib 0.10.2 (an unknown one aborts)
    "baseline": "",
    # XNNPACK / YNNPACK (library fusions; by default YNNPACK runs single dots)
    "ynn-off": _YNN_OFF,
    "ynn-all": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce,individual_dot,individual_convolution",
    "xnn-dots": f"{_YNN_OFF} --xla_cpu_experimental_xnn_fusion_type=dot,individual_dot,individual_convolution",
    "xnn-graph": f"{_YNN_OFF} --xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "xnnpack-off": "--xla_cpu_use_xnnpack=false",
    # oneDNN
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn-custom-call": "--xla_cpu_experimental_onednn_custom_call=true",
    # threading and scheduling
    "eigen-single-thread": "--xla_cpu_multi_thread_eigen=false",
    "sched-concurrency": "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_CONCURRENCY_OPTIMIZED",
    "sched-memory": "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED",
    # code generation
    "fusion-emitters-off": "--xla_cpu_use_fusion_emitters=false",
    "isa-avx2": "--xla_cpu_max_isa=AVX2",
    "vector-512": "--xla_cpu_prefer_vector_width=512",
    "fast-math": "--xla_cpu_enable_fast_math=true",
    "preset-fast-runtime": "--xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_RUNTIME",
    "tiling-propagation": "--xla_cpu_experimental_enable_tiling_propagation=true",
    # combinations of the singles that came out below 1.0x on some workload (none beyond the noise)
    "avx2+concurrency": ("--xla_cpu_max_isa=AVX2"
                         " --xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_CONCURRENCY_OPTIMIZED"),
    "avx2+concurrency+fast-math": ("--xla_cpu_max_isa=AVX2"
                                   " --xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_CONCURRENCY_OPTIMIZED"
                                   " --xla_cpu_enable_fast_math=true"),
}
EXTRA = ("onednn-custom-call", "sched-memory", "vector-512", "preset-fast-runtime", "tiling-propagation")
COMBOS = ("isa-avx2", "avx2+concurrency", "avx2+concurrency+fast-math")
GROUPS = {"main": tuple(s for s in SETTINGS if s not in EXTRA + COMBOS[1:]), "extra": EXTRA, "combos": COMBOS,
          "all": tuple(SETTINGS)}
QUICK_SETTINGS = ("baseline", "ynn-off")


@dataclasses.dataclass(frozen=True)
class XlaFlagsBenchConfig:
    """Settings of the XLA:CPU options benchmark."""

    settings: str = "main"
    """Comma-separated names of SETTINGS, or a group: main (one setting per flag, ~15 min), extra (the other
    values), combos (combinations of singles), all; the baseline always runs."""
    flags: str = ""
    """One more setting, named "custom": these XLA_FLAGS (e.g. a combination of the singles)."""
    workloads: str = ",".join(WORKLOADS)
    """Comma-separated workloads: mlp-regression, mnist-cnn, char-gpt (the baby preset)."""
    repeats: int = 3
    """Repetitions, interleaved across settings (each a fresh process per setting)."""
    calls: int = 3
    """Timed calls per workload in each process (after the compiling call and --warmup)."""
    steps_per_call: int = 8
    """K, steps per compiled call (fixed, so that every setting compiles the same program)."""
    warmup: int = 2
    """Untimed calls after the compiling one (at least 1)."""
    timeout: float = 600.0
    """Seconds before a child process is killed (its setting is reported as failed)."""
    out: str = ""
    """Directory for results.json (default runs/bench-xla-flags)."""
    quick: bool = False
    """A smoke run: mlp-regression, baseline and ynn-off, 1 repetition, 1 + 1 + 2 calls of K=2, a slice of the data."""

    def __post_init__(self) -> None:
        for field, least in (("repeats", 1), ("calls", 1), ("steps_per_call", 1), ("warmup", 1)):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < least:
                raise ConfigError(f"{field}={getattr(self, field)!r} must be an integer >= {least}")
        unknown = [w for w in _names(self.workloads) if w not in WORKLOADS]
        if unknown or not _names(self.workloads):
            raise ConfigError(f"workloads={self.workloads!r}: choose from {', '.join(WORKLOADS)}")
        if self.settings not in GROUPS:
            unknown = [s for s in _names(self.settings) if s not in SETTINGS]
            if unknown:
                raise ConfigError(f"unknown setting {unknown[0]!r}: choose from {', '.join(SETTINGS)}, "
                                  f"a group ({', '.join(GROUPS)}), or --flags")


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def selected_settings(config: XlaFlagsBenchConfig) -> dict[str, str]:
    """name -> XLA_FLAGS of the settings to run, the baseline first."""
    names = list(GROUPS.get(config.settings, ())) or _names(config.settings)
    chosen = {"baseline": ""} | {n: SETTINGS[n] for n in names}
    if config.flags.strip():
        chosen["custom"] = config.flags.strip()
    return chosen


# --- the child: one process, one setting, every workload ---------------------------------------------------

def _timing_hook(skip: int):
    """A hook that times each compiled call after the first `skip` (each waited for): seconds per step."""
    import jax

    from jaxtrain import Hook

    class TimeCalls(Hook):
        def __init__(self) -> None:
            self.n, self.t, self.first_s, self.per_step_s = 0, time.perf_counter(), 0.0, []

        def on_start(self, run: Any) -> None:
            self.t = time.perf_counter()

        def after_call(self, run: Any, k: int, metrics: dict[str, jax.Array]) -> None:
            jax.block_until_ready(metrics)
            now = time.perf_counter()
            self.n += 1
            if self.n == 1:
                self.first_s = now - self.t  # compiling and running the first call
            elif self.n > skip:
                self.per_step_s.append((now - self.t) / k)
            self.t = now

    return TimeCalls()


def time_workload(workload: str, calls: int, steps_per_call: int, warmup: int, quick: bool) -> dict[str, Any]:
    """Trains `workload` through `fit` for 1 + warmup + calls compiled calls of K steps; the timed calls' ms/step."""
    from benchmarks.profile import ProfileBenchConfig, recipe_config
    from jaxtrain.engine import RunOptions, run

    # recipe_config runs warmup + steps / K calls; the first of ours compiles, so one more warm-up call
    pconfig = ProfileBenchConfig(workload=workload, steps=calls * steps_per_call, steps_per_call=steps_per_call,
                                 warmup=warmup + 1, quick=quick)
    recipe, rconfig = recipe_config(workload, pconfig)
    w = recipe.build(rconfig)
    hook = _timing_hook(skip=1 + warmup)
    try:
        result = run(w.model, w.loss_fn, w.train, None, rconfig, hooks=[hook], preprocess=w.preprocess,
                     augment=w.augment, verbosity="silent", session=RunOptions(name=recipe.name))
    finally:
        w.close()
    ms = [s * 1e3 for s in hook.per_step_s]
    return {"ms_per_step": statistics.median(ms), "calls_ms_per_step": ms, "first_call_s": hook.first_s,
            "compile_s": result.summary["compile_time_s"]}


def _child(payload: dict[str, Any]) -> dict[str, Any]:
    import jax

    results = {}
    for workload in payload["workloads"]:
        try:
            results[workload] = time_workload(workload, payload["calls"], payload["steps_per_call"],
                                              payload["warmup"], payload["quick"])
        except Exception as e:  # noqa: BLE001 - a flag may break one workload's compile; record it, go on
            results[workload] = {"error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:300]}
    return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "jax_version": jax.__version__, "results": results,
            "compilation_cache": jax.config.jax_compilation_cache_dir}  # None: every program compiled


# --- the parent: interleaved repetitions, medians, verdicts -------------------------------------------------

def verdict(times: list[float], base: list[float], ratios: list[float]) -> str:
    """"faster" / "slower" when the setting's repetitions all lie beyond the baseline's (and every paired
    ratio agrees), else "no clear difference"."""
    if not times or not base:
        return "failed"
    if max(times) < min(base) and all(r < 1 for r in ratios):
        return "faster"
    if min(times) > max(base) and all(r > 1 for r in ratios):
        return "slower"
    return "no clear difference"


def summarize(runs: list[dict[str, Any]], settings: list[str], workloads: list[str]) -> list[dict[str, Any]]:
    """Per (workload, setting): median and range of the repetitions' ms/step, the ratio of medians to the
    baseline's, the per-repetition ratios (same repetition's baseline), and the verdict."""
    by = {(r["rep"], r["setting"]): r for r in runs}
    reps = sorted({r["rep"] for r in runs})
    rows = []
    for workload in workloads:
        def series(setting: str, key: str = "ms_per_step") -> dict[int, float]:
            out = {}
            for rep in reps:
                res = by.get((rep, setting), {}).get("results", {}).get(workload, {})
                if key in res:
                    out[rep] = res[key]
            return out

        base = series("baseline")
        base_median = statistics.median(base.values()) if base else None
        base_compile = series("baseline", "compile_s")
        for setting in settings:
            s, compiles = series(setting), series(setting, "compile_s")
            errors = {by.get((rep, setting), {}).get("error") or
                      by.get((rep, setting), {}).get("results", {}).get(workload, {}).get("error") for rep in reps}
            errors.discard(None)
            row: dict[str, Any] = {"workload": workload, "setting": setting, "reps": len(s)}
            if s:
                median = statistics.median(s.values())
                ratios = [s[r] / base[r] for r in s if r in base]
                row |= {"ms_median": median, "ms_min": min(s.values()), "ms_max": max(s.values()),
                        "ratio": median / base_median if base_median else None,
                        "paired_ratios": ratios,
                        "verdict": "baseline" if setting == "baseline" else verdict(list(s.values()),
                                                                                     list(base.values()), ratios)}
            else:
                row |= {"verdict": "failed"}
            if compiles and base_compile:  # the training programs' compile (`fit`'s compile_time_s), no cache
                compile_s = statistics.median(compiles.values())
                row |= {"compile_s_median": compile_s,
                        "compile_ratio": compile_s / statistics.median(base_compile.values())}
            if errors:
                row["error"] = sorted(errors)[0]
            rows.append(row)
    return rows


def main(config: XlaFlagsBenchConfig) -> int:
    from rich.console import Console
    from rich.table import Table

    if config.quick:
        config = dataclasses.replace(config, workloads="mlp-regression", repeats=1, calls=2, steps_per_call=2,
                                     warmup=1, settings=",".join(QUICK_SETTINGS) if config.settings == "main"
                                     else config.settings)
    settings = selected_settings(config)
    workloads = _names(config.workloads)
    out = Path(config.out or "runs/bench-xla-flags")
    out.mkdir(parents=True, exist_ok=True)
    console = Console(highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    cpu = _cpu_model()
    console.print(f"XLA:CPU options: {len(settings)} settings x {config.repeats} interleaved repetitions, each a "
                  f"fresh process training {', '.join(workloads)} (K={config.steps_per_call}, {config.warmup} "
                  f"warm-up + {config.calls} timed calls); {os.cpu_count()} cores, {cpu}")
    if os.environ.get("XLA_FLAGS"):
        console.print(f"note: your XLA_FLAGS ({os.environ['XLA_FLAGS']}) are not passed to the settings' processes")
    names = list(settings)
    load = [os.getloadavg()[0]]
    runs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for rep in range(config.repeats):
        for setting in names[rep % len(names):] + names[:rep % len(names)]:  # rotated: no fixed position
            r = run_child("benchmarks.xla_flags", {"workloads": workloads, "calls": config.calls,
                                                        "steps_per_call": config.steps_per_call,
                                                        "warmup": config.warmup, "quick": config.quick},
                          timeout=config.timeout,  # no persistent cache: every setting compiles
                          env={"XLA_FLAGS": settings[setting], "JAX_COMPILATION_CACHE_DIR": None})
            runs.append({"rep": rep, "setting": setting, "flags": settings[setting], **r})
            shown = "; ".join(f"{w} {v['ms_per_step']:.2f}" if "ms_per_step" in v else f"{w} FAILED"
                              for w, v in r.get("results", {}).items()) or f"FAILED: {r.get('error')}"
            console.print(f"  rep {rep + 1}/{config.repeats} {setting:<20} {shown} ms/step")
            console.file.flush()
        load.append(os.getloadavg()[0])
    rows = summarize(runs, names, workloads)

    for workload in workloads:
        table = Table(title=f"{workload}: ms per training step (median of {config.repeats} repetitions "
                            f"[min-max]), ratio to no options; seconds compiling (no cache)")
        for column in ("setting", "XLA_FLAGS", "ms/step", "range", "ratio", "per-rep ratios", "verdict", "compile s",
                       "compile ratio"):
            table.add_column(column, justify="left" if column in ("setting", "XLA_FLAGS", "verdict") else "right")
        for row in rows:
            if row["workload"] != workload:
                continue
            if "ms_median" not in row:
                table.add_row(row["setting"], settings[row["setting"]], "-", "-", "-", "-",
                              f"failed: {row.get('error', '')}"[:80], "-", "-")
                continue
            table.add_row(row["setting"], settings[row["setting"]].replace("--xla_cpu_", "")[:60],
                          f"{row['ms_median']:.2f}", f"{row['ms_min']:.2f}-{row['ms_max']:.2f}",
                          "-" if row["ratio"] is None else f"{row['ratio']:.3f}",
                          " ".join(f"{r:.2f}" for r in row["paired_ratios"]), row["verdict"],
                          f"{row['compile_s_median']:.2f}" if "compile_s_median" in row else "-",
                          f"{row['compile_ratio']:.3f}" if "compile_ratio" in row else "-")
        console.print(table)
    winners = {s: [r["verdict"] for r in rows if r["setting"] == s] for s in names if s != "baseline"}
    clear = [s for s, v in winners.items() if "faster" in v and "slower" not in v and "failed" not in v]
    console.print("faster on some workload and slower on none: " + (", ".join(clear) or "none"))
    console.print(f"1-minute load average per repetition: {', '.join(f'{x:.2f}' for x in load)}; "
                  f"{time.perf_counter() - t0:.0f} s in all")
    payload = {"config": dataclasses.asdict(config), "settings": settings, "cpu_count": os.cpu_count(),
               "cpu_model": cpu, "load_average": load, "rows": rows, "runs": runs, "clear_winners": clear}
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"wrote {out / 'results.json'}")
    failed = [r for r in rows if r["setting"] == "baseline" and r["verdict"] == "failed"]
    return 1 if failed else 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    child_main(_child)
