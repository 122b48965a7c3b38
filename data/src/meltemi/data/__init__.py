"""meltemi.data.

A deterministic token store: tensorstore shards, Feistel permutations, mixtures, packing.

>>> import meltemi.data
>>> meltemi.data.__version__
'0.1.0'
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
