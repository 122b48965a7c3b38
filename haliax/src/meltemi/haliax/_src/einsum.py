"""`haliax._src.einsum`: `einsum` at the module path Haliax code imports."""

from meltemi.haliax._einsum import einsum

__all__ = ["einsum"]
