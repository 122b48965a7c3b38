"""`haliax.nn.pool`: the pooling functions at the module path Haliax code imports."""

from meltemi.haliax.nn._pool import DEFAULT_PADDING, Padding, max_pool, mean_pool, min_pool

__all__ = ["DEFAULT_PADDING", "Padding", "max_pool", "mean_pool", "min_pool"]
