"""Serving the dashboard: the bind rule (loopback, or another address with a token) and a
server in a background thread (beside a training run, in tests)."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import uvicorn

from meltemi.levanter.dashboard._app import create_app
from meltemi.levanter.dashboard._root import DashboardError

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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url_of(host: str, port: int) -> str:
    """The address to open (loopback spelled `127.0.0.1`; a token is not included)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "localhost") else host
    return f"http://{shown}:{port}/"


class DashboardServer:
    """The dashboard served by uvicorn in a daemon thread: `with DashboardServer(dir) as url:`.

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
        self.host = host
        self.port = port or free_port("127.0.0.1" if host in LOOPBACK else host)
        self.app = create_app(runs_dir, token=token, **app_options)
        # No access log: a request line can carry ?token=. No log config either: the host
        # process (a trainer, a test) owns logging.
        config = uvicorn.Config(
            self.app,
            host=host,
            port=self.port,
            log_level="warning",
            access_log=False,
            log_config=None,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="dashboard", daemon=True)

    @property
    def url(self) -> str:
        return url_of(self.host, self.port)

    def start(self, timeout_s: float = 60.0) -> str:
        """Starts serving; returns the URL once uvicorn listens."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the dashboard did not start on {self.url}")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        """Asks uvicorn to exit and waits for it."""
        self._server.should_exit = True
        self._thread.join(30)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
