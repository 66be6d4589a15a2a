"""`jaxtrain bench gpu`: the mission's GPU figures in one command, one JSON and one table.

Made for one H100 or H200 inside a short lease (`benchmarks/gpu.sh` starts it there with the machine's
own JAX and this checkout on PYTHONPATH); the parts share a budget of about 9 minutes:

  gpt         nanoGPT's shakespeare-char configuration (config/train_shakespeare_char.py: 6 layers,
              6 heads, 384 wide, block 256, batch 64, dropout 0.2, 5000 iterations, AdamW 1e-3 -> 1e-4)
              through `jaxtrain train char-gpt` in bf16: best validation loss (nanoGPT: 1.4697; target
              <= 1.47), wall time and MFU (XLA's FLOPs of the step x steps/s over the chip's promised
              bf16 dense rate);
  zoo         the zoo's MNIST CNN and four models written elsewhere (`jaxtrain bench zoo`): fit's
              defaults against each source's own loop, steady state and short runs;
  precision   fp32 / bf16 / fp16 and gradient accumulation (`jaxtrain bench precision`);
  attention   the causal attention paths in bf16 at T = 64, 256, 1024 (`jaxtrain bench attention`);
  population  populations of 16 and 64 members stacked in one program against the same member-steps
              run one member at a time (examples/population_formulations.py, lone and vmap).

Each part is a child process with its share of what is left of the budget; a part that fails or
outruns its share is a row saying so, and the parts after it still run. The children's own outputs
are kept beside the JSON. `--tiny` runs every part at toy sizes on any machine: the test in `make test`
runs it on the CPU, so the command cannot rot between leases.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jaxtrain import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("gpt", "zoo", "precision", "attention", "population")
# The share of the budget each part may use at most (what is left is passed on to the next).
SHARES = {"gpt": 0.45, "zoo": 0.25, "precision": 0.08, "attention": 0.07, "population": 0.15}
NANOGPT_VAL_LOSS = 1.4697  # nanoGPT's README for config/train_shakespeare_char.py (A100, about 3 minutes)
TARGET_VAL_LOSS = 1.47
# Promised dense bf16 matrix rates (FLOP/s) by device kind, as the vendors state them; MFU needs one.
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}

NANOGPT = ["--batch-size", "64", "--model.block-size", "256", "--model.n-layer", "6", "--model.n-head", "6",
           "--model.n-embd", "384", "--model.dropout", "0.2", "--epochs", "20", "--steps-per-epoch", "250",
           "--optim.decay-steps", "5000", "--optim.warmup-steps", "100", "--precision", "bf16"]
NANOGPT_TINY = ["--batch-size", "4", "--model.block-size", "16", "--model.n-layer", "1", "--model.n-head", "2",
                "--model.n-embd", "16", "--epochs", "1", "--steps-per-epoch", "4", "--data.limit", "4000",
                "--data.eval-batches", "2", "--eval-batch-size", "4", "--optim.decay-steps", "4",
                "--optim.warmup-steps", "1"]
ZOO_MODELS = "flax-mnist-cnn,keras-convnet,resnet-bn,tiny-vit,transformer-mha"


@dataclasses.dataclass(frozen=True)
class GpuBenchConfig:
    """Settings of the GPU proof."""

    parts: str = ",".join(PARTS)
    """Comma-separated parts to run (gpt, zoo, precision, attention, population)."""
    budget_s: float = 540.0
    """Seconds for all parts together (each gets its share of what is left)."""
    tiny: bool = False
    """Every part at toy sizes (any machine, about a minute of CPU): a smoke test, not figures."""
    out: str = "gpu-bench"
    """Folder for gpu.json, gpu.md and each part's output."""


def commands(part: str, tiny: bool, out: Path) -> list[list[str]]:
    """The child command(s) of `part`."""
    jaxtrain = [sys.executable, "-m", "jaxtrain"]
    if part == "gpt":
        flags = NANOGPT_TINY if tiny else NANOGPT
        return [[*jaxtrain, "train", "char-gpt", *flags, "--run-dir", str(out / "gpt"), "--overwrite", "--quiet",
                 "--checkpoint.no-enabled"]]
    if part == "zoo":
        sizes = ["--quick"] if tiny else ["--models", ZOO_MODELS, "--repeats", "1", "--short-repeats", "1"]
        return [[*jaxtrain, "bench", "zoo", *sizes, "--out", str(out / "zoo.json")]]
    if part == "precision":
        return [[*jaxtrain, "bench", "precision", *(["--quick"] if tiny else [])]]
    if part == "attention":
        return [[*jaxtrain, "bench", "attention", *(["--quick", "--dtype", "float32"] if tiny
                                                    else ["--dtype", "bfloat16"])]]
    if part == "population":
        sizes = ["2", "--steps", "5", "--repeats", "1"] if tiny else ["16", "64", "--repeats", "3"]
        return [[sys.executable, str(ROOT / "examples" / "population_formulations.py"), *sizes, "--only", "lone,vmap"]]
    raise ConfigError(f"unknown part {part!r}; choose among {', '.join(PARTS)}")


def run_part(part: str, tiny: bool, out: Path, seconds: float) -> dict[str, Any]:
    """Runs `part`'s commands within `seconds`: its status, wall time, output file and figures."""
    log = out / f"{part}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    status = "ok"
    with log.open("w") as sink:
        for command in commands(part, tiny, out):
            left = seconds - (time.perf_counter() - t0)
            sink.write(f"$ {' '.join(command)}\n")
            sink.flush()
            try:
                code = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                      timeout=max(left, 1.0)).returncode
            except subprocess.TimeoutExpired:
                status = f"outran its {seconds:.0f} s"
                break
            if code != 0:
                status = f"exit {code}"
                break
    result = {"part": part, "status": status, "wall_s": round(time.perf_counter() - t0, 1), "log": log.name}
    result.update(figures(part, out, log.read_text()))
    return result


def figures(part: str, out: Path, printed: str) -> dict[str, Any]:
    """What `part` measured, read from its files (the gpt run's summary.json, the zoo's JSON) or its
    printed table (the tail of the log, for the parts that print tables only)."""
    if part == "gpt":
        path = out / "gpt" / "summary.json"
        if not path.is_file():
            return {}
        s = json.loads(path.read_text())
        flops = (s.get("model") or {}).get("flops_per_step")
        peak = next((rate for kind, rate in PEAK_BF16.items() if kind in str(s.get("device"))), None)
        mfu = flops * s["steps_per_s"] / peak if flops and peak and s.get("steps_per_s") else None
        return {"best_val_loss": s["best_val_loss"], "steps": s["steps"], "total_time_s": s["total_time_s"],
                "train_time_s": s["train_time_s"], "compile_time_s": s["compile_time_s"],
                "steps_per_s": s["steps_per_s"], "flops_per_step": flops, "mfu": mfu, "device": s["device"],
                "target_val_loss": TARGET_VAL_LOSS, "nanogpt_val_loss": NANOGPT_VAL_LOSS,
                "met": s["best_val_loss"] is not None and s["best_val_loss"] <= TARGET_VAL_LOSS}
    if part == "zoo":
        path = out / "zoo.json"
        if not path.is_file():
            return {}
        return {"models": {r["model"]: {"fit_steps_per_s_over_hand": r["speed"], "short_run_fit_over_hand":
                                        r["short_ratio"], "loss_rel_diff": r["loss_rel_diff"]}
                           for r in json.loads(path.read_text())["results"]}}
    return {"table": printed.strip().splitlines()[-24:]}


def headline(result: dict[str, Any]) -> str:
    """One cell: the part's main figure."""
    if result["part"] == "gpt" and "best_val_loss" in result:
        mfu = f", MFU {result['mfu']:.0%}" if result.get("mfu") is not None else ""
        return (f"val loss {result['best_val_loss']:.4f} (target <= {TARGET_VAL_LOSS}: "
                f"{'met' if result['met'] else 'missed'}) in {result['total_time_s']:.0f} s, "
                f"{result['steps_per_s']:.1f} steps/s{mfu}")
    if result["part"] == "zoo" and "models" in result:
        return "; ".join(f"{name} {m['fit_steps_per_s_over_hand']:.2f}x steps/s, "
                         f"short {m['short_run_fit_over_hand']:.2f}x" for name, m in result["models"].items())
    return f"its table: {result['log']}" if result.get("table") else ""


def main(config: GpuBenchConfig) -> int:
    parts = [p.strip() for p in config.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise ConfigError(f"unknown part {unknown[0] if unknown else '(none)'!r}; choose among {', '.join(PARTS)}")
    if config.budget_s <= 0:
        raise ConfigError(f"budget_s={config.budget_s} must be > 0")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    import jax

    device = str(jax.devices()[0].device_kind)
    print(f"GPU proof on {device} ({jax.default_backend()}), jax {jax.__version__}; budget {config.budget_s:.0f} s"
          + (" (tiny sizes: a smoke test, not figures)" if config.tiny else ""), flush=True)
    start = time.perf_counter()
    results = []
    for i, part in enumerate(parts):
        left = config.budget_s - (time.perf_counter() - start)
        share = sum(SHARES[p] for p in parts[i:])
        seconds = left if config.tiny else left * SHARES[part] / share
        result = run_part(part, config.tiny, out, seconds)
        results.append(result)
        print(f"  {part:10} {result['status']:>12} {result['wall_s']:7.1f} s  {headline(result)}", flush=True)
    report = {"device": device, "backend": jax.default_backend(), "jax": jax.__version__, "tiny": config.tiny,
              "budget_s": config.budget_s, "wall_s": round(time.perf_counter() - start, 1), "parts": results}
    (out / "gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"GPU proof on {device}, jax {jax.__version__}: `jaxtrain bench gpu` (`benchmarks/gpu.sh`), "
             f"{report['wall_s']:.0f} s of a {config.budget_s:.0f} s budget", "",
             "| part | status | wall s | figure |", "|---|---|---:|---|"]
    lines += [f"| {r['part']} | {r['status']} | {r['wall_s']:.0f} | {headline(r)} |" for r in results]
    (out / "gpu.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'gpu.json'} and {out / 'gpu.md'}")
    return 0 if all(r["status"] == "ok" for r in results) else 1
