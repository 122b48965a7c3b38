"""Serving the dashboard: the bind rule (loopback, or another address with a token) and a
server in a background thread (beside a training run, in tests)."""

from __future__ import annotations

import os
from typing import Any

from meltemi.levanter.dashboard._app import create_app
from meltemi.levanter.dashboard._root import DashboardError

# The module, not the package: `meltemi.models.serve` imports the engine and sse-starlette.
from meltemi.models.serve._background import BackgroundServer, free_port

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: The token can come from the environment (a flag shows in `ps`).
TOKEN_ENV = "MELTEMI_DASHBOARD_TOKEN"
MIN_TOKEN_CHARS = 16


class BindError(DashboardError):
    """Serving beyond loopback without a token (or with a guessable one)."""


def check_bind(host: str, token: str | None) -> None:
    """Refuses a non-loopback address without a token of at least `MIN_TOKEN_CHARS`.

    Raises:
        BindError: naming the address and how to pass a token.
    """
    if host in LOOPBACK:
        return
    if not token:
        raise BindError(
            f"--host={host!r} serves the dashboard beyond this machine, so it needs a token: "
            f"pass --token=... or set {TOKEN_ENV} (e.g. `export {TOKEN_ENV}=$(openssl rand "
            "-hex 16)`); or keep the default --host=127.0.0.1 and use an SSH tunnel."
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise BindError(
            f"--token has {len(token)} characters; use at least {MIN_TOKEN_CHARS} random ones "
            "(e.g. `openssl rand -hex 16`)."
        )


def url_of(host: str, port: int) -> str:
    """The address to open (loopback spelled `127.0.0.1`; a token is not included)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "localhost") else host
    return f"http://{shown}:{port}/"


class DashboardServer(BackgroundServer):
    """The dashboard served by uvicorn in a daemon thread: `with DashboardServer(dir) as url:`.

    A `BackgroundServer` that checks the bind rule first and logs no requests (a request line
    can carry `?token=`).

    Args:
        runs_dir: the folder of run directories.
        host: the address to bind (loopback by default; another one needs `token`).
        port: the port (0: a free one).
        token: required off loopback (see `check_bind`).
        **app_options: more `create_app` options (live_window_s, static_dir, clock).
    """

    def __init__(
        self,
        runs_dir: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        **app_options: Any,
    ):
        check_bind(host, token)
        self.app = create_app(runs_dir, token=token, **app_options)
        # No log config either: the host process (a trainer, a test) owns logging.
        super().__init__(
            self.app,
            host=host,
            port=port or free_port("127.0.0.1" if host in LOOPBACK else host),
            uvicorn_options={"access_log": False, "log_config": None},
        )

    @property
    def url(self) -> str:
        return url_of(self.host, self.port)
