"""Haliax's `haliax.specialized_fns` module: `top_k` (also `hax.top_k`).

>>> import meltemi.haliax as hax
>>> from meltemi.haliax.specialized_fns import top_k
>>> top_k(hax.arange(hax.Axis("v", 5)), "v", 2)[0].array
Array([4, 3], dtype=int32)
"""

from meltemi.haliax._ops import top_k

__all__ = ["top_k"]
