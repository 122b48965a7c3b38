"""meltemi.haliax.

Named-axis tensors on JAX and equinox: axes by name, sharding by a logical-to-mesh map.

>>> import meltemi.haliax
>>> meltemi.haliax.__version__
'0.1.0'
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
