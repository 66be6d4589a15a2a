"""jaxtrain.engine: the public low tier under `fit`, for tools and advanced users.

`jaxtrain.fit` is the front door; this module holds the parts it is made of, for code that builds
its own front door (as Lightning's Fabric sits under its Trainer): the program builder
(`build_program`, `Program`) and the device layout (`make_layout`, `Layout`); a run with the options
only a tool passes (`run(..., session=RunOptions(...))`, the loop's `Run`, the library's own hooks'
`RunHook`); the checkpointer and the run directory's guard; and the engine-level services the
`jaxtrain` command's tools build on: compile cache, memory release, safe file writing, the error
style, the run's reports. `jaxtrain.tools` imports only `jaxtrain`, this module and the public
namespaces (`tests/library/test_layers.py`); docs/api.md says what each name is for.

These names are public, unlike `jaxtrain._src`: they change only with a note. A name here whose
`_src` name says less outside its module is renamed (`COMPILE_CACHE_ENV` is the compile cache's
`ENV`); `_HOMES` records each one's home and name there.

Each name is imported on its first use, as `jaxtrain`'s are: `import jaxtrain.engine` loads no JAX,
so the command line's modules import from here at their top and still answer `--help` at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and readers see; at run time `__getattr__` imports the same
    from jaxtrain._src.checkpoint import Checkpointer
    from jaxtrain._src.checks import abstract_batch, check_path_length
    from jaxtrain._src.compile_cache import ENV as COMPILE_CACHE_ENV
    from jaxtrain._src.compile_cache import command_cache_dir
    from jaxtrain._src.config import MAX_SEED, flat_dict, from_dict, to_dict
    from jaxtrain._src.data.generate import GenerateResult
    from jaxtrain._src.data.generate import check_arguments as check_generate_arguments
    from jaxtrain._src.data.sources import hdf5_reason, rows_text
    from jaxtrain._src.data.synthetic import WORKLOADS, regression_rows
    from jaxtrain._src.data.transforms import from_spec, to_spec
    from jaxtrain._src.errors import argument, rendering, setting
    from jaxtrain._src.evaluate import evaluate_state
    from jaxtrain._src.export import check_directory as check_export_directory
    from jaxtrain._src.export import check_platforms as check_export_platforms
    from jaxtrain._src.extras import missing_package, require
    from jaxtrain._src.feeds import budget_bytes, epoch_steps
    from jaxtrain._src.hooks.base import Run, RunHook
    from jaxtrain._src.hooks.profile import ProfileBudgetReached
    from jaxtrain._src.load import load_with_step, read_config
    from jaxtrain._src.loop import RunOptions, run
    from jaxtrain._src.machine import matmul_rate, measure_matmul_rate, record_matmul_rate, standard_matmul_size
    from jaxtrain._src.memory import compiled_memory, format_bytes, imports_outside_gc, release_compiled_programs
    from jaxtrain._src.models.attention import choose_path as attention_path
    from jaxtrain._src.models.attention import cudnn as cudnn_attention
    from jaxtrain._src.models.attention import heads_major as heads_major_attention
    from jaxtrain._src.models.gpt import sample as sample_gpt
    from jaxtrain._src.optim import optimizer_structure
    from jaxtrain._src.population import PER_MEMBER
    from jaxtrain._src.predict import Forward, predict_batches
    from jaxtrain._src.probes import loop_body_counted_once
    from jaxtrain._src.program import Program, build_program
    from jaxtrain._src.report.blocks import device_description
    from jaxtrain._src.report.memory_report import memory_lines
    from jaxtrain._src.report.model_summary import model_summary, summary_lines
    from jaxtrain._src.report.plots import log_scale_with_plain_labels, plot_run, save_figure
    from jaxtrain._src.report.profile_report import profile_lines
    from jaxtrain._src.report.run_dir import refuse_links
    from jaxtrain._src.rl.solver import solver_player
    from jaxtrain._src.run_guard import RunGuard, checkpoint_steps, lock_directory
    from jaxtrain._src.safe_files import atomic_write, check_target, refuse_same_file, remove_partials, write_text
    from jaxtrain._src.sharding import Layout, make_layout
    from jaxtrain._src.step import Augment, LossFn, Preprocess, make_evaluate

# engine name -> (the module it comes from, its name there); tests/library/test_api.py checks that
# the imports above say the same
_HOMES = {
    "Augment": ("jaxtrain._src.step", "Augment"),
    "COMPILE_CACHE_ENV": ("jaxtrain._src.compile_cache", "ENV"),
    "Checkpointer": ("jaxtrain._src.checkpoint", "Checkpointer"),
    "Forward": ("jaxtrain._src.predict", "Forward"),
    "GenerateResult": ("jaxtrain._src.data.generate", "GenerateResult"),
    "Layout": ("jaxtrain._src.sharding", "Layout"),
    "LossFn": ("jaxtrain._src.step", "LossFn"),
    "MAX_SEED": ("jaxtrain._src.config", "MAX_SEED"),
    "PER_MEMBER": ("jaxtrain._src.population", "PER_MEMBER"),
    "optimizer_structure": ("jaxtrain._src.optim", "optimizer_structure"),
    "checkpoint_steps": ("jaxtrain._src.run_guard", "checkpoint_steps"),
    "Preprocess": ("jaxtrain._src.step", "Preprocess"),
    "ProfileBudgetReached": ("jaxtrain._src.hooks.profile", "ProfileBudgetReached"),
    "Program": ("jaxtrain._src.program", "Program"),
    "Run": ("jaxtrain._src.hooks.base", "Run"),
    "RunGuard": ("jaxtrain._src.run_guard", "RunGuard"),
    "RunHook": ("jaxtrain._src.hooks.base", "RunHook"),
    "RunOptions": ("jaxtrain._src.loop", "RunOptions"),
    "WORKLOADS": ("jaxtrain._src.data.synthetic", "WORKLOADS"),
    "abstract_batch": ("jaxtrain._src.checks", "abstract_batch"),
    "argument": ("jaxtrain._src.errors", "argument"),
    "atomic_write": ("jaxtrain._src.safe_files", "atomic_write"),
    "attention_path": ("jaxtrain._src.models.attention", "choose_path"),
    "budget_bytes": ("jaxtrain._src.feeds", "budget_bytes"),
    "build_program": ("jaxtrain._src.program", "build_program"),
    "check_export_directory": ("jaxtrain._src.export", "check_directory"),
    "check_export_platforms": ("jaxtrain._src.export", "check_platforms"),
    "check_generate_arguments": ("jaxtrain._src.data.generate", "check_arguments"),
    "check_path_length": ("jaxtrain._src.checks", "check_path_length"),
    "check_target": ("jaxtrain._src.safe_files", "check_target"),
    "command_cache_dir": ("jaxtrain._src.compile_cache", "command_cache_dir"),
    "compiled_memory": ("jaxtrain._src.memory", "compiled_memory"),
    "cudnn_attention": ("jaxtrain._src.models.attention", "cudnn"),
    "device_description": ("jaxtrain._src.report.blocks", "device_description"),
    "epoch_steps": ("jaxtrain._src.feeds", "epoch_steps"),
    "evaluate_state": ("jaxtrain._src.evaluate", "evaluate_state"),
    "flat_dict": ("jaxtrain._src.config", "flat_dict"),
    "format_bytes": ("jaxtrain._src.memory", "format_bytes"),
    "from_dict": ("jaxtrain._src.config", "from_dict"),
    "from_spec": ("jaxtrain._src.data.transforms", "from_spec"),
    "hdf5_reason": ("jaxtrain._src.data.sources", "hdf5_reason"),
    "heads_major_attention": ("jaxtrain._src.models.attention", "heads_major"),
    "imports_outside_gc": ("jaxtrain._src.memory", "imports_outside_gc"),
    "load_with_step": ("jaxtrain._src.load", "load_with_step"),
    "lock_directory": ("jaxtrain._src.run_guard", "lock_directory"),
    "log_scale_with_plain_labels": ("jaxtrain._src.report.plots", "log_scale_with_plain_labels"),
    "loop_body_counted_once": ("jaxtrain._src.probes", "loop_body_counted_once"),
    "make_evaluate": ("jaxtrain._src.step", "make_evaluate"),
    "make_layout": ("jaxtrain._src.sharding", "make_layout"),
    "matmul_rate": ("jaxtrain._src.machine", "matmul_rate"),
    "measure_matmul_rate": ("jaxtrain._src.machine", "measure_matmul_rate"),
    "memory_lines": ("jaxtrain._src.report.memory_report", "memory_lines"),
    "missing_package": ("jaxtrain._src.extras", "missing_package"),
    "model_summary": ("jaxtrain._src.report.model_summary", "model_summary"),
    "plot_run": ("jaxtrain._src.report.plots", "plot_run"),
    "predict_batches": ("jaxtrain._src.predict", "predict_batches"),
    "profile_lines": ("jaxtrain._src.report.profile_report", "profile_lines"),
    "read_config": ("jaxtrain._src.load", "read_config"),
    "record_matmul_rate": ("jaxtrain._src.machine", "record_matmul_rate"),
    "refuse_links": ("jaxtrain._src.report.run_dir", "refuse_links"),
    "refuse_same_file": ("jaxtrain._src.safe_files", "refuse_same_file"),
    "regression_rows": ("jaxtrain._src.data.synthetic", "regression_rows"),
    "release_compiled_programs": ("jaxtrain._src.memory", "release_compiled_programs"),
    "remove_partials": ("jaxtrain._src.safe_files", "remove_partials"),
    "rendering": ("jaxtrain._src.errors", "rendering"),
    "require": ("jaxtrain._src.extras", "require"),
    "rows_text": ("jaxtrain._src.data.sources", "rows_text"),
    "run": ("jaxtrain._src.loop", "run"),
    "sample_gpt": ("jaxtrain._src.models.gpt", "sample"),
    "save_figure": ("jaxtrain._src.report.plots", "save_figure"),
    "setting": ("jaxtrain._src.errors", "setting"),
    "solver_player": ("jaxtrain._src.rl.solver", "solver_player"),
    "standard_matmul_size": ("jaxtrain._src.machine", "standard_matmul_size"),
    "summary_lines": ("jaxtrain._src.report.model_summary", "summary_lines"),
    "to_dict": ("jaxtrain._src.config", "to_dict"),
    "to_spec": ("jaxtrain._src.data.transforms", "to_spec"),
    "write_text": ("jaxtrain._src.safe_files", "write_text"),
}

__all__ = [
    "Augment",
    "COMPILE_CACHE_ENV",
    "Checkpointer",
    "Forward",
    "GenerateResult",
    "Layout",
    "LossFn",
    "MAX_SEED",
    "PER_MEMBER",
    "Preprocess",
    "ProfileBudgetReached",
    "Program",
    "Run",
    "RunGuard",
    "RunHook",
    "RunOptions",
    "WORKLOADS",
    "abstract_batch",
    "argument",
    "atomic_write",
    "attention_path",
    "budget_bytes",
    "build_program",
    "check_export_directory",
    "check_export_platforms",
    "check_generate_arguments",
    "check_path_length",
    "check_target",
    "checkpoint_steps",
    "command_cache_dir",
    "compiled_memory",
    "cudnn_attention",
    "device_description",
    "epoch_steps",
    "evaluate_state",
    "flat_dict",
    "format_bytes",
    "from_dict",
    "from_spec",
    "hdf5_reason",
    "heads_major_attention",
    "imports_outside_gc",
    "load_with_step",
    "lock_directory",
    "log_scale_with_plain_labels",
    "loop_body_counted_once",
    "make_evaluate",
    "make_layout",
    "matmul_rate",
    "measure_matmul_rate",
    "memory_lines",
    "missing_package",
    "model_summary",
    "optimizer_structure",
    "plot_run",
    "predict_batches",
    "profile_lines",
    "read_config",
    "record_matmul_rate",
    "refuse_links",
    "refuse_same_file",
    "regression_rows",
    "release_compiled_programs",
    "remove_partials",
    "rendering",
    "require",
    "rows_text",
    "run",
    "sample_gpt",
    "save_figure",
    "setting",
    "solver_player",
    "standard_matmul_size",
    "summary_lines",
    "to_dict",
    "to_spec",
    "write_text",
]


def __getattr__(name: str) -> Any:
    """An engine name's value, imported on its first use and kept (later lookups do not come here)."""
    if name not in _HOMES:
        raise AttributeError(f"module 'jaxtrain.engine' has no attribute {name!r}")
    module, attribute = _HOMES[name]
    value = globals()[name] = getattr(importlib.import_module(module), attribute)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
