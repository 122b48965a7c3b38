"""The binaries: `train` (the trainer), `plot` (redraw a loss curve) and `bench`.

They define their absl flags only when run, so importing them (e.g. for doctests) is harmless.

Example:
    >>> from meltemi.levanter.main import train
    >>> train.config_arg(["train", "--config=levanter/configs/default.py:smoke"])
    'levanter/configs/default.py:smoke'
"""

__all__: list[str] = []
