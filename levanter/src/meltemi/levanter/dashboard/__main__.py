r"""The run dashboard: `./bazelw run //levanter:dashboard -- --runs=DIR --port=8080`.

Also `python -m meltemi.levanter.dashboard --runs=DIR`. Serves every run under DIR (a local
folder or gs://BUCKET/DIR) at http://127.0.0.1:PORT/. Serving on another address needs
`--host=0.0.0.0` and a token (`--token=...` or $MELTEMI_DASHBOARD_TOKEN, 16+ characters); every
request then carries it (`?token=...` in the URL the server prints, or a bearer header).

Exit status: 0 stopped with Ctrl-C; 2 a mistake in the flags (one `error:` line).
"""

from __future__ import annotations

import os
import sys

import uvicorn
from absl import app, flags

from meltemi.levanter.dashboard._app import create_app
from meltemi.levanter.dashboard._root import DashboardError
from meltemi.levanter.dashboard._runs import LIVE_WINDOW_S
from meltemi.levanter.dashboard._server import TOKEN_ENV, check_bind, url_of


def _runs_dir(text: str) -> str:
    if "://" in text:
        return text
    path = os.path.expanduser(text)
    base = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()  # `bazel run` runs elsewhere
    return os.path.join(base, path)


def main(argv: list[str]) -> int:
    """Serves until interrupted; returns the exit status."""
    del argv
    f = flags.FLAGS
    token = f.token or os.environ.get(TOKEN_ENV) or None
    try:
        if not 0 < f.port < 65536:
            raise DashboardError(f"--port={f.port}: must be in 1..65535, e.g. --port=8080.")
        check_bind(f.host, token)
        runs_dir = _runs_dir(f.runs)
        application = create_app(runs_dir, token=token, live_window_s=f.live_window_s)
    except DashboardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    url = url_of(f.host, f.port)
    shown = url + ("?token=<the token>" if token else "")  # never printed: it would be logged
    print(f"dashboard: serving {runs_dir} at {shown} (Ctrl-C stops)", flush=True)
    uvicorn.run(application, host=f.host, port=f.port, log_level="warning", access_log=False)
    return 0


def run() -> None:
    """Entry point: defines the flags and serves."""
    flags.DEFINE_string("runs", None, "The folder of run directories (or gs://...).", required=True)
    flags.DEFINE_integer("port", 8080, "The port to serve on.")
    flags.DEFINE_string(
        "host", "127.0.0.1", "The address to bind; another than loopback needs a token."
    )
    flags.DEFINE_string("token", "", f"The access token off loopback (or ${TOKEN_ENV}).")
    flags.DEFINE_float(
        "live_window_s",
        LIVE_WINDOW_S,
        "A run without status.json is running if "
        "its metrics.jsonl changed this many seconds ago or less.",
    )
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
