"""meltemi.fray.

A small, fast, authenticated RPC actor runtime: in-process, local processes, and Ray.

>>> import meltemi.fray
>>> meltemi.fray.__version__
'0.1.0'
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
