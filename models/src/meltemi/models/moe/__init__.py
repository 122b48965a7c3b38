"""meltemi.models.moe: the mixture-of-experts MLP (Mixtral, Qwen3-MoE) and its expert parallelism.

`MoeMlp` (router plus SwiGLU experts) is built by `Transformer` for a family whose record has
`moe` set; `MoeConfig` picks its dispatch path. The private modules: `_mlp` (the layer),
`_kernels` (dropless and capacity dispatch), `_ep` (expert parallelism over the mesh) and
`_ragged` (its ragged exchange; the CPU emulator for tests is `meltemi.models.testing`).
"""

from meltemi.models.moe._mlp import MoeMlp

__all__ = ["MoeMlp"]
