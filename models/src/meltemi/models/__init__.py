"""meltemi.models.

Llama, Qwen3, MoE, GPT-2 and Gemma on haliax, with Hugging Face interop and generation.

>>> import meltemi.models
>>> meltemi.models.__version__
'0.1.0'
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
