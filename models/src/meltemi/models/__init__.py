"""meltemi.models: Llama, Qwen3, MoE, GPT-2 and Gemma on haliax, with Hugging Face interop.

>>> import meltemi.models as mm
>>> cfg = mm.get_preset("tiny-llama")
>>> cfg.family, cfg.num_layers
('llama', 3)
"""

from meltemi.models import hf, lora
from meltemi.models._axes import AXIS_NAMES
from meltemi.models._config import (
    ACTIVATIONS,
    FAMILIES,
    REMAT_POLICIES,
    SEQUENCE_PARALLEL,
    ConfigError,
    ModelConfig,
    MoeConfig,
    RopeConfig,
)
from meltemi.models._counting import flops_per_token, param_count
from meltemi.models._generate import generate
from meltemi.models._layers import LayerCache
from meltemi.models._presets import get_preset, list_presets
from meltemi.models._sampling import SamplingConfig
from meltemi.models._transformer import Block, Transformer, init
from meltemi.models.hf._config import HfConfigError, from_hf_config, to_hf_config
from meltemi.models.hf._safetensors import SafetensorsError
from meltemi.models.hf._storage import StorageError
from meltemi.models.moe import MoeMlp

__version__ = "0.1.0"

__all__ = [
    "AXIS_NAMES",
    "Block",
    "LayerCache",
    "MoeMlp",
    "SamplingConfig",
    "Transformer",
    "generate",
    "hf",
    "lora",
    "init",
    "ACTIVATIONS",
    "FAMILIES",
    "REMAT_POLICIES",
    "SEQUENCE_PARALLEL",
    "ConfigError",
    "HfConfigError",
    "ModelConfig",
    "MoeConfig",
    "RopeConfig",
    "SafetensorsError",
    "StorageError",
    "__version__",
    "flops_per_token",
    "from_hf_config",
    "get_preset",
    "list_presets",
    "param_count",
    "to_hf_config",
]
