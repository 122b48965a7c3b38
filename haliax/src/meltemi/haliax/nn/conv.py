"""`haliax.nn.conv`: the convolution layers at the module path Haliax code imports."""

from meltemi.haliax.nn._conv import Conv, ConvTranspose

__all__ = ["Conv", "ConvTranspose"]
