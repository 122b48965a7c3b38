"""`haliax._src.fp8`: FP8 delayed-scaling helpers at the module path Haliax code imports."""

from meltemi.haliax._quant_ops import compute_scale

__all__ = ["compute_scale"]
