"""Where a run reports: metrics.jsonl, TensorBoard, W&B, the progress bar, the loss PNG.

Example:
    >>> from meltemi.levanter.tracking import REQUIRED_KEYS
    >>> REQUIRED_KEYS[:2]
    ('step', 'train/loss')
"""

from meltemi.levanter.tracking._jsonl import REQUIRED_KEYS, MetricsWriter, read_metrics
from meltemi.levanter.tracking._plot import plot_loss_curve
from meltemi.levanter.tracking._progress import ProgressBar
from meltemi.levanter.tracking._tensorboard import TensorBoardWriter, crc32c
from meltemi.levanter.tracking._wandb import WANDB_ID_FILE, open_wandb, wandb_run_id

__all__ = [
    "REQUIRED_KEYS",
    "WANDB_ID_FILE",
    "MetricsWriter",
    "ProgressBar",
    "TensorBoardWriter",
    "crc32c",
    "open_wandb",
    "plot_loss_curve",
    "read_metrics",
    "wandb_run_id",
]
