"""meltemi.models.serve: an OpenAI-compatible HTTP server over the continuous-batching engine.

`create_app` builds the FastAPI application over an `EngineRunner` (the thread that owns the
`meltemi.models.engine.Engine`); `load_app` does both from a checkpoint directory. The binary is
`bazel run //models:serve -- --checkpoint=DIR`. Needs the `serve` extra (FastAPI, uvicorn,
sse-starlette; `pip install 'meltemi-models[serve]'`); `import meltemi.models` does not import it.

>>> from meltemi.models.serve import ApiError
>>> ApiError(404, "model: 'x' is not served here", param="model").body()["error"]["param"]
'model'
"""

from meltemi.models.serve._app import RETRY_AFTER_S, create_app
from meltemi.models.serve._background import BackgroundServer, free_port
from meltemi.models.serve._load import load_app
from meltemi.models.serve._protocol import ApiError, Params
from meltemi.models.serve._runner import EngineRunner, Handle, Stats

__all__ = [
    "RETRY_AFTER_S",
    "ApiError",
    "BackgroundServer",
    "EngineRunner",
    "Handle",
    "Params",
    "Stats",
    "create_app",
    "free_port",
    "load_app",
]
