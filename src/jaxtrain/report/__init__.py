"""Progress bars, summary blocks and run-directory files."""

from jaxtrain.report.blocks import epoch_block, final_block
from jaxtrain.report.plots import plot_run
from jaxtrain.report.progress import EpochProgress
from jaxtrain.report.run_dir import RunDir, read_jsonl

__all__ = ["EpochProgress", "RunDir", "epoch_block", "final_block", "plot_run", "read_jsonl"]
