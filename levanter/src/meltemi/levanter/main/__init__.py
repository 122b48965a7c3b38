"""The binaries: `train` (the trainer), `isoflop`, `eval`, `harness`, `status`, `plot`.

They define their absl flags only when run, so importing them (e.g. for doctests) is harmless;
they parse `--config` and its overrides one way (`_flags.parse`).

Example:
    >>> from meltemi.levanter.main import train
    >>> callable(train.run)
    True
"""

__all__: list[str] = []
