"""The logical axis names every model uses (the trainer maps them onto mesh axes).

>>> import meltemi.models as mm
>>> sorted(mm.AXIS_NAMES)[:3]
['batch', 'embed', 'experts']
"""

from __future__ import annotations

import meltemi.haliax as hax
from meltemi.models._config import ModelConfig

BATCH = "batch"
POSITION = "position"
KEY_POSITION = "key_position"
EMBED = "embed"
MLP = "mlp"
KV_HEADS = "kv_heads"
Q_HEADS_PER_GROUP = "q_heads_per_group"
HEAD_SIZE = "head_size"
VOCAB = "vocab"
LAYERS = "layers"
EXPERTS = "experts"
MAX_POSITION = "max_position"

AXIS_NAMES = (
    BATCH,
    POSITION,
    KEY_POSITION,
    EMBED,
    MLP,
    KV_HEADS,
    Q_HEADS_PER_GROUP,
    HEAD_SIZE,
    VOCAB,
    LAYERS,
    EXPERTS,
    MAX_POSITION,
)


class ModelAxes:
    """The sized axes of one config (`Embed`, `Vocab`, `Layers`, ... as `hax.Axis` values)."""

    def __init__(self, config: ModelConfig):
        self.Embed = hax.Axis(EMBED, config.hidden_dim)
        self.Vocab = hax.Axis(VOCAB, config.vocab_size)
        self.Layers = hax.Axis(LAYERS, config.num_layers)
        self.Mlp = hax.Axis(MLP, config.moe.expert_dim if config.moe else config.intermediate_dim)
        self.KVHeads = hax.Axis(KV_HEADS, config.num_kv_heads)
        self.QHeadsPerGroup = hax.Axis(Q_HEADS_PER_GROUP, config.q_heads_per_group)
        self.HeadSize = hax.Axis(HEAD_SIZE, config.head_size)
        self.MaxPosition = hax.Axis(MAX_POSITION, config.max_seq_len)
        self.Experts = hax.Axis(EXPERTS, config.moe.num_experts) if config.moe else None
