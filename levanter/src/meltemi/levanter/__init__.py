"""meltemi.levanter.

Optimizers and the multislice trainer binary of the Meltemi stack.

>>> import meltemi.levanter
>>> meltemi.levanter.__version__
'0.1.0'
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
