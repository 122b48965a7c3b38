"""`haliax._src.parsing`: the rearrange/einsum pattern parser, at the path Haliax code imports."""

from meltemi.haliax._parsing import Expression, parse_einsum, parse_rearrangement

__all__ = ["Expression", "parse_einsum", "parse_rearrangement"]
