"""A run dashboard in the browser: `python -m meltemi.levanter.dashboard --runs=DIR`.

The server reads a folder of run directories (local or `gs://`) as the trainer writes them and
serves a JSON API (`create_app`) and the front end in `static/`; `DashboardServer` runs it in a
background thread (the trainer's `--dashboard_port` flag, tests).

Example:
    >>> from meltemi.levanter.dashboard import downsample
    >>> import numpy as np
    >>> s, v = downsample(np.arange(100), np.where(np.arange(100) == 37, 9.0, 1.0), 10)
    >>> 37 in s.tolist(), len(s) <= 11
    (True, True)
"""

from meltemi.levanter.dashboard._app import STATIC_DIR, create_app, token_matches
from meltemi.levanter.dashboard._metrics import MetricsLog, downsample
from meltemi.levanter.dashboard._root import (
    DashboardError,
    NotFoundError,
    OutsideRootError,
    RunsRoot,
)
from meltemi.levanter.dashboard._runs import Runs, flatten
from meltemi.levanter.dashboard._server import (
    TOKEN_ENV,
    BindError,
    DashboardServer,
    check_bind,
    free_port,
)

__all__ = [
    "STATIC_DIR",
    "TOKEN_ENV",
    "BindError",
    "DashboardError",
    "DashboardServer",
    "MetricsLog",
    "NotFoundError",
    "OutsideRootError",
    "Runs",
    "RunsRoot",
    "check_bind",
    "create_app",
    "downsample",
    "flatten",
    "free_port",
    "token_matches",
]
