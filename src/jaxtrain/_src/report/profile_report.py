"""A run's profile: shares of its wall time, FLOP/s against the device's matmul rate, a verdict and
the two changes that would help most (`build_profile`: `summary["profile"]`), and its text
(`profile_lines`: in the final block and `jaxtrain profile`).

The verdict looks at the training loop alone (compilation, evaluation and setup are one-off or
per-epoch costs, shown but not judged): the largest of input wait (copies included), per-call
overhead (dispatch) and hooks' work between calls (host sync) names the bound when it is at least
`BOUND_SHARE` of the loop's time, since removing it would then speed training up by 1.33x or
more; otherwise the run is compute-bound: the device is what it waits for.
"""

from __future__ import annotations

import math
from typing import Any

from jaxtrain._src.errors import render, setting

BOUND_SHARE = 0.25  # a part other than compute that takes this share of the loop bounds it
OVERHEAD_TARGET = 0.02  # the per-call overhead a suggested K brings a call down to (as AutoSteps)
COMPILE_NOTE_SHARE = 0.3  # compilation above this share of the run gets a note
MEASURE_HINT = "run `jaxtrain doctor` to measure it"  # where the matmul rate comes from (`_src.machine`)
LOW_MFU = 0.3  # below this share of the matmul rate, a larger batch is worth trying
FEW_CALLS = 10  # fewer calls than this: per-call figures are dominated by first runs
MIN_SAVING = 0.05  # changes estimated to save less of the training loop are not suggested
PARTS = {  # share key -> label, in the order of the table
    "compile": "compile",
    "transfer": "copy to device",
    "input": "input wait",
    "compute": "compute",
    "dispatch": "dispatch",
    "host_sync": "host sync",
    "epoch_hooks": "eval & epoch hooks",
    "other": "other",
}
LOOP_PARTS = ("input", "transfer", "compute", "dispatch", "host_sync")
VERDICTS = ("input-bound", "dispatch-bound", "host-sync-bound", "compute-bound")


def build_profile(m: dict[str, Any]) -> dict[str, Any]:
    """The profile (JSON-ready) from `hooks.profile.ProfileHook`'s measurements `m`.

    Returns:
      A dict with `seconds` and `shares` of the wall time (keys of `PARTS`; shares sum to 1),
      `loop_shares` of the training loop (`LOOP_PARTS`), per-call and per-step times, `compiles`
      and `recompilations`, FLOP figures (`flops_per_step`, `achieved_flop_s`, `peak_flop_s`,
      `mfu`; None where unknown), `verdict` (one of `VERDICTS`), `reason`, `advice` (the two
      `{"flag", "saves", "text"}` that save most; `flag` is the setting to change, written for the caller
      (`TrainConfig(batch_size=64)` from Python, the flag under the command line), None where no
      option makes the change) and `notes`.
    """
    train_s, calls, steps = m["train_s"], m["calls"], m["steps"]
    wait = m["input_wait_s"]
    transfer = wait * min(1.0, m["background_copy_s"] / train_s) if train_s > 0 else 0.0
    device_overhead = min(m["device_wait_s"], calls * m["device_overhead_per_call_s"])
    host_sync = sum(m["after_call_hooks_s"].values())
    residual = max(train_s - (wait + m["device_wait_s"] + m["dispatch_s"] + host_sync), 0.0)  # the loop's Python
    loop = {"input": wait - transfer, "transfer": transfer, "compute": m["device_wait_s"] - device_overhead,
            "dispatch": m["dispatch_s"] + residual + device_overhead, "host_sync": host_sync}
    loop_s = sum(loop.values())  # the training time (more only where measured parts overlapped)
    seconds = {"compile": m["compile_s"], **loop,
               "epoch_hooks": max(m["epoch_hooks_s"] - m["epoch_compile_s"], 0.0)}
    seconds["transfer"] += m["setup_copy_s"]
    seconds["other"] = max(m["wall_s"] - sum(seconds.values()), 0.0)
    wall = sum(seconds.values())
    p: dict[str, Any] = {
        "wall_s": wall, "train_s": loop_s, "steps": steps, "calls": calls, "steps_per_call": m["steps_per_call"],
        "longest_call": m.get("longest_call") or m["steps_per_call"],
        "steps_per_epoch": m["steps_per_epoch"], "batch_size": m["batch_size"], "placement": m["placement"],
        "device": m["device"], "budget_reached": m["budget_reached"], "step_form": m.get("step_form"),
        "seconds": {k: seconds[k] for k in PARTS},
        "shares": {k: seconds[k] / wall if wall else 0.0 for k in PARTS},
        "loop_shares": {k: loop[k] / loop_s if loop_s else 0.0 for k in LOOP_PARTS},
        "overhead_per_call_s": loop["dispatch"] / calls,
        "compute_per_step_s": loop["compute"] / steps,
        "autosteps_fit": None if m["fitted"] is None else {"step_s": m["fitted"][0], "overhead_s": m["fitted"][1]},
        "hooks_s": dict(sorted(m["after_call_hooks_s"].items(), key=lambda kv: -kv[1])),
        "compiles": m["compiles"],
    }
    trained = [c for c in m["compiles"] if c.get("what") == "train call"]
    p["recompilations"] = trained[1:]
    fps, peak = m["flops_per_step"], m["peak_flop_s"]
    p["flops_per_step"] = fps
    p["achieved_flop_s"] = fps * steps / loop_s if fps and loop_s else None
    p["compute_flop_s"] = fps * steps / loop["compute"] if fps and loop["compute"] > 0 else None
    p["peak_flop_s"] = peak * m["devices"] if peak else None
    p["mfu"] = p["achieved_flop_s"] / p["peak_flop_s"] if p["achieved_flop_s"] and p["peak_flop_s"] else None
    p["verdict"], p["reason"] = _verdict(p, m)
    p["advice"] = _advice(p, m)[:2]
    p["notes"] = _notes(p, m)
    return p


def _verdict(p: dict[str, Any], m: dict[str, Any]) -> tuple[str, str]:
    """(verdict, why) from the loop's shares."""
    s = p["loop_shares"]
    bounds = {"input-bound": s["input"] + s["transfer"], "dispatch-bound": s["dispatch"],
              "host-sync-bound": s["host_sync"]}
    name, share = max(bounds.items(), key=lambda kv: kv[1])
    if share < BOUND_SHARE:
        mfu = f"; {p['mfu']:.0%} of the float32 matmul rate" if p["mfu"] is not None else ""
        return "compute-bound", f"the device computed {s['compute']:.0%} of the training loop's time{mfu}"
    if name == "input-bound":
        what = "host-to-device copies" if s["transfer"] > s["input"] else "reading"
        return name, f"the loop waited for batches {share:.0%} of its time (mostly {what})"
    if name == "dispatch-bound":
        k = p["steps_per_call"]
        return name, (f"per-call overhead is {share:.0%} of the training loop: {_ms(p['overhead_per_call_s'])} per "
                      f"call against {_ms(k * p['compute_per_step_s'])} of compute in a call of K={k} steps")
    top = next(iter(p["hooks_s"]))
    return name, (f"hooks' work after each call is {share:.0%} of the training loop ({top}: "
                  f"{p['hooks_s'][top]:.2f}s)")


def _advice(p: dict[str, Any], m: dict[str, Any]) -> list[dict[str, Any]]:
    """Changes ranked by the share of the training loop each would save (a rough estimate, in the
    item as `saves`; those under `MIN_SAVING` are left out), the best fix of the verdict's bound
    first: per-call overhead goes with a larger K, input wait with data on the device, hooks' syncs
    with fewer fetches; compute with bf16 on an accelerator (about half) or a larger batch when the
    matmul rate is far from reached. Changes no option makes have flag None."""
    s, k, spe, B = p["loop_shares"], p["steps_per_call"], p["steps_per_epoch"], m["batch_size"]
    low_mfu = p["mfu"] is not None and p["mfu"] < LOW_MFU
    out = []
    if k < spe:
        overhead, step = p["overhead_per_call_s"], p["compute_per_step_s"]
        needed = math.ceil(overhead / (OVERHEAD_TARGET * step)) if step > 0 else spe
        new_k = min(spe, max(2 * k, 1 << max(0, math.ceil(math.log2(max(needed, 1))))))
        share = overhead / (overhead + new_k * step)
        out.append(_item("dispatch-bound", setting("steps_per_call", new_k), s["dispatch"] * (1 - k / new_k),
                         f"the {_ms(overhead)} overhead is paid once per call: {new_k} steps per call make it "
                         f"about {share:.0%} of a call (0 lets jaxtrain measure K)"))
    rate = f", and larger matmuls run nearer the device's rate (now {p['mfu']:.1%} of it)" if low_mfu else ""
    # A batch or precision changes what trains, which a profile does not measure: these name the tool or
    # the comparison that does, never a flag to change on the profile's word alone.
    out.append(_item("compute-bound", None,
                     (s["dispatch"] + s["host_sync"]) / 2 + (s["compute"] / 4 if low_mfu else 0.0),
                     f"a larger batch: more work per step for the same per-call costs{rate}; `jaxtrain tune "
                     f"batch-size` finds the fastest that trains as well as batch {B} (its learning rate checked "
                     "on short runs)"))
    if m["placement"] == "stream":
        out.append(_item("input-bound", setting("data.placement", "device"), s["input"] + s["transfer"],
                         "hold the training set on the device: no reads or copies per batch (it must fit; raise "
                         f"{setting('data.memory_budget_gb')} when auto placement streamed it)"))
        out.append(_item("input-bound", None, s["input"] / 2, "a faster source: HDF5 uncompressed or lzf with "
                         "chunks of >= 1 MiB, on a local disk (`jaxtrain data inspect FILE` shows the layout)"))
        out.append(_item("input-bound", None, s["transfer"] / 2, "fewer bytes per sample to copy: store inputs as "
                         "uint8 or bfloat16 and convert them in `preprocess`, inside the compiled step"))
    if m["placement"] == "loader":
        out.append(_item("input-bound", None, s["input"] / 2, "a faster loader: more worker processes (DataLoader "
                         "num_workers, Grain worker_count), or its map-style dataset passed to fit itself, which "
                         "jaxtrain reads on threads or holds on the device"))
    for name, seconds in p["hooks_s"].items():
        share = seconds / p["train_s"] if p["train_s"] else 0.0
        if name == "MetricsHook":
            out.append(_item("host-sync-bound", setting("log_every", 10 * m["log_every"]), 0.9 * share,
                             "metrics are fetched from the device every log_every steps; each fetch waits for it"))
        elif name in m.get("user_hooks", ()):  # the library's own hooks are not the user's to change
            out.append(_item("host-sync-bound", None, share, f"{name} works after every call: read device values "
                             "in `on_log` rows or every N calls, not after each call"))
    if m["platform"] != "cpu" and m["precision"] == "fp32":
        out.append(_item("compute-bound", None, s["compute"] / 2, f"bfloat16 matmuls ({setting('precision', 'bf16')}) "
                         "run several times faster than float32 on GPUs and TPUs (the loss and the optimizer update "
                         "stay float32); not measured here: compare a run's loss with this one's before keeping it"))
    ranked = sorted((c for c in out if c["saves"] >= MIN_SAVING), key=lambda c: (c["fixes"] != p["verdict"],
                                                                                    -c["saves"]))
    ranked[1:] = sorted(ranked[1:], key=lambda c: -c["saves"])  # after the bound's best fix, the most saving
    if p["verdict"] == "compute-bound":
        if m["platform"] == "cpu":
            ranked.append(_item("compute-bound", None, 0.0, "an accelerator: on a CPU the step's arithmetic is the "
                                "limit (and bfloat16 does not run faster there)"))
        ranked.append(_item("compute-bound", None, 0.0, "nothing in the loop to fix: the device does the work, so a "
                            "larger model uses it well"))
    return ranked


def _notes(p: dict[str, Any], m: dict[str, Any]) -> list[str]:
    """Remarks: too few calls to judge, compilation's share of a short run, and recompilations a K that
    divides the epoch avoids."""
    notes = []
    if p["calls"] < FEW_CALLS:
        calls = f"{p['calls']} call" + ("s" if p["calls"] != 1 else "")
        notes.append(f"only {calls}: per-call figures include each program's first run; a run of more calls "
                     "measures the steady state")
    if p["shares"]["compile"] >= COMPILE_NOTE_SHARE:
        notes.append(f"compilation is {p['shares']['compile']:.0%} of this run: paid once, it shrinks as the run "
                     "grows (and programs in the persistent cache skip it: the jaxtrain command keeps one; "
                     "jaxtrain.enable_compile_cache() from Python)")
    k, spe = p["steps_per_call"], p["steps_per_epoch"]
    short = sorted({c["k"] for c in p["recompilations"] if c["why"].startswith("last call of the epoch")})
    if short:
        near = [d for d in range(max(1, k // 2), 2 * k + 1) if spe % d == 0]  # K within a factor 2 of the run's
        fix = f" ({render(setting('steps_per_call', min(near, key=lambda d: abs(d - k))))})" if near else ""
        notes.append(f"the epoch's last call (K={', '.join(map(str, short))}) needed a program of its own: a K that "
                     f"divides the {spe} steps of an epoch avoids it{fix}")
    return notes


def _item(fixes: str, flag: str | None, saves: float, text: str) -> dict[str, Any]:
    """A change: the bound it `fixes` (a verdict), its option (a `setting` token, or None), the share
    of training time it would save at most, and why; tokens rendered in the current style."""
    return {"flag": render(flag) if flag else None, "saves": saves, "text": render(text), "fixes": fixes}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 0.1 else f"{seconds:.2f} s"


def _rate(flop_s: float) -> str:
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6), ("kFLOP/s", 1e3)):
        if flop_s >= scale:
            return f"{flop_s / scale:,.1f} {unit}"
    return f"{flop_s:,.0f} FLOP/s"


TRAINING_PROGRAMS = {"train call": "K={k}", "train step": "1 step", "train steps, unrolled": "{k} unrolled"}
"""The programs that train (`CompiledCalls.compiles`' `what`) and how a profile line names each."""


def profile_lines(p: dict[str, Any]) -> list[str]:
    """The profile as text lines: the table of shares, compilations, FLOP/s, the verdict and advice."""
    k, longest = p["steps_per_call"], p.get("longest_call") or p["steps_per_call"]
    budget = "; stopped at the time budget" if p["budget_reached"] else ""
    up_to = f"K={k}" if longest == k else f"{longest} steps (K={k})"  # K changed after a longer call
    lines = [f"PROFILE: where the {p['wall_s']:.1f}s went (training loop {p['train_s']:.2f}s: {p['steps']:,} steps "
             f"in {p['calls']:,} call{'s' if p['calls'] != 1 else ''} of up to {up_to}{budget})"]
    detail = {
        "compile": f"{len(p['compiles'])} program" + ("s" if len(p["compiles"]) != 1 else ""),
        "compute": f"{_ms(p['compute_per_step_s'])} per step",
        "dispatch": f"{_ms(p['overhead_per_call_s'])} per call",
        "host_sync": ", ".join(f"{name} {s:.2f}s" for name, s in list(p["hooks_s"].items())[:2] if s >= 0.005),
        "input": {"stream": "training data streamed", "loader": "batches from the loader"}.get(p["placement"], ""),
        "other": "setup, checks, checkpoints, files, printing",
    }
    for key, label in PARTS.items():
        lines.append(f"  {label:<19} {p['seconds'][key]:8.2f}s {p['shares'][key]:6.1%}  {detail.get(key, '')}".rstrip())
    for c in [c for c in p["compiles"] if c.get("what") in TRAINING_PROGRAMS]:
        name = TRAINING_PROGRAMS[c["what"]].format(k=c["k"])
        ran = f"; {c['calls']:,} call{'s' if c['calls'] != 1 else ''}" if "calls" in c else ""
        lines.append(f"  compiled {name:<10} {c['seconds']:6.2f}s  {c['why']}{ran}")
    if p.get("step_form"):  # the loop body against the plain step, and the ops a loop body makes slow
        lines.append(f"  Form:     {p['step_form']['form']} ({p['step_form']['why']})")
    if p["flops_per_step"]:
        rate = f"{_rate(p['achieved_flop_s'])} achieved"
        if p["compute_flop_s"]:
            rate += f" ({_rate(p['compute_flop_s'])} while computing)"
        peak = (f"; MFU {p['mfu']:.1%} of the {_rate(p['peak_flop_s'])} float32 matmul rate" if p["mfu"] is not None
                else f"; the device's matmul rate is unknown ({MEASURE_HINT})" if not p["peak_flop_s"] else "")
        lines.append(f"  FLOPs:    {_rate(p['flops_per_step'])[:-2]} per step (XLA cost analysis); {rate}{peak}")
    lines.append(f"  Verdict:  {p['verdict']}: {p['reason']}")
    for i, a in enumerate(p["advice"]):
        head = "  Try:      " if i == 0 else "            "
        saves = f" (saves up to ~{a['saves']:.0%} of training time)" if a["saves"] >= 0.01 else ""
        lines.append(f"{head}{i + 1}. " + (f"{a['flag']}: " if a["flag"] else "") + a["text"] + saves)
    lines += [f"  Note:     {note}" for note in p["notes"]]
    return lines
