"""`BackgroundServer`: uvicorn in a thread on a free loopback port (tests, benches, notebooks)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    """Serves `app` with uvicorn in a daemon thread; `with BackgroundServer(app) as url:`.

    Args:
        app: an ASGI application (`create_app`'s).
        host: the address to bind (loopback by default).
        port: the port (default: a free one).
        startup_timeout_s: how long `start` waits for uvicorn to listen.
        uvicorn_options: more `uvicorn.Config` options (e.g. `access_log=False`), over the
            default `log_level="warning"`.
    """

    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", port: int | None = None,
        startup_timeout_s: float = 60.0, uvicorn_options: Mapping[str, Any] | None = None,
    ):  # fmt: skip
        import uvicorn

        self.host = host
        self.port = port or free_port(host)
        options = {"log_level": "warning", **(uvicorn_options or {})}
        config = uvicorn.Config(app, host=host, port=self.port, **options)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)
        self._timeout = startup_timeout_s

    @property
    def url(self) -> str:
        """`http://host:port` (append `/v1` for an OpenAI client's `base_url`)."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Starts serving; returns `url` once uvicorn listens."""
        self._thread.start()
        deadline = time.monotonic() + self._timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
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
