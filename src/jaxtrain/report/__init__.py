"""Progress bars, summary blocks and run-directory files."""

from jaxtrain.report.blocks import build_summary, device_description, epoch_block, final_block, header_block
from jaxtrain.report.plots import plot_run
from jaxtrain.report.progress import EpochProgress
from jaxtrain.report.run_dir import RunDir, read_jsonl

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
]
