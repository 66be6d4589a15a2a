"""Progress bars, summary blocks and run-directory files."""

from jaxtrain._src.report.blocks import (
    build_summary,
    device_description,
    epoch_block,
    final_block,
    header_block,
    result_block,
)
from jaxtrain._src.report.plots import plot_run
from jaxtrain._src.report.progress import EpochProgress
from jaxtrain._src.report.run_dir import RunDir, read_jsonl

__all__ = [
    "EpochProgress",
    "RunDir",
    "build_summary",
    "device_description",
    "epoch_block",
    "final_block",
    "header_block",
    "plot_run",
    "read_jsonl",
    "result_block",
]
