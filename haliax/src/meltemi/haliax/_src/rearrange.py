"""`haliax._src.rearrange`: einops-style `rearrange` at the module path Haliax code imports."""

from meltemi.haliax._einops import rearrange as einops_rearrange

__all__ = ["einops_rearrange"]
