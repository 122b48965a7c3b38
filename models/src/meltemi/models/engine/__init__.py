"""meltemi.models.engine: continuous-batching inference over a paged KV cache.

>>> from meltemi.models.engine import EngineConfig
>>> EngineConfig(kv_bytes=1 << 20).page_size
16
"""

from meltemi.models.engine._config import (
    EngineConfig,
    EngineError,
    Event,
    FinishReason,
    QueueFullError,
    Request,
    RequestError,
)
from meltemi.models.engine._engine import Engine
from meltemi.models.engine._paged_attention import (
    PAGED_BACKENDS,
    native_paged_attention,
    pallas_gpu_paged_attention,
    pallas_tpu_paged_attention,
    reference_paged_attention,
)
from meltemi.models.engine._pages import PageAllocator

__all__ = [
    "PAGED_BACKENDS",
    "Engine",
    "EngineConfig",
    "EngineError",
    "Event",
    "FinishReason",
    "PageAllocator",
    "QueueFullError",
    "Request",
    "RequestError",
    "native_paged_attention",
    "pallas_gpu_paged_attention",
    "pallas_tpu_paged_attention",
    "reference_paged_attention",
]
