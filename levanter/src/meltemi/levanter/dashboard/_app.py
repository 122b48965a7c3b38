"""The dashboard's ASGI app: the JSON API of `B_api.md`, server-sent events, static files.

Errors are `{"error": "..."}` with 400 (a bad query value), 401 (token), 403 (a path outside
the runs folder) or 404; bad data on disk (corrupt metrics lines, half-written JSON) is skipped
and counted, never an error.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import os
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from meltemi.levanter.dashboard._provenance import Provenance
from meltemi.levanter.dashboard._root import DashboardError, RunsRoot
from meltemi.levanter.dashboard._runs import LIVE_WINDOW_S, Runs, lower_thread_priority
from meltemi.levanter.dashboard._sweeps import sweep_detail, sweep_list

#: B2's front end (index.html, app.js, app.css, vendor/).
STATIC_DIR = pathlib.Path(__file__).parent / "static"
VERSION = "0.1.0"
#: How often the event stream looks for new metrics lines, and pings an idle client.
STREAM_POLL_S = 0.5
STREAM_PING_S = 15.0


def _sanitize(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_sanitize(v) for v in value]
    return value


def _dumps(content: Any) -> str:
    try:
        return json.dumps(content, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a NaN or infinity somewhere (status.json, eval.json): null
        return json.dumps(_sanitize(content), allow_nan=False, separators=(",", ":"))


class SafeJSONResponse(JSONResponse):
    """JSON that browsers parse: non-finite floats are sent as `null`."""

    def render(self, content: Any) -> bytes:
        return _dumps(content).encode()


def _error(status: int, message: str) -> JSONResponse:
    return SafeJSONResponse({"error": message}, status_code=status)


def token_matches(given: str | None, token: str) -> bool:
    """Constant-time comparison of a request's token with the server's."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _keys(keys: str | None) -> list[str] | None:
    return [k for k in keys.split(",") if k] if keys else None


def create_app(
    runs_dir: str | os.PathLike,
    *,
    token: str | None = None,
    live_window_s: float = LIVE_WINDOW_S,
    static_dir: str | os.PathLike | None = None,
    clock: Callable[[], float] = time.time,
    index_in_background: bool = True,
) -> FastAPI:
    """The dashboard app serving the runs under `runs_dir`.

    Args:
        runs_dir: the folder of run directories (local path or `gs://...`).
        token: if set, every request needs `Authorization: Bearer TOKEN` or `?token=TOKEN`.
        live_window_s: a run without status.json is running if its metrics changed this
            recently.
        static_dir: the front end's files (default: the package's `static/`).
        clock: the wall clock (tests pass a fake one).
        index_in_background: parse every run's metrics in a background thread now, so that
            the first look at a long run finds it parsed (the bench turns it off to time a
            cold parse).
    """
    runs = Runs(RunsRoot(runs_dir), live_window_s=live_window_s, clock=clock)
    if index_in_background:

        def index() -> None:
            lower_thread_priority()
            runs.index_all()

        threading.Thread(target=index, name="dashboard-index", daemon=True).start()
    provenance = Provenance(runs)
    app = FastAPI(title="Meltemi dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runs = runs

    @app.middleware("http")
    async def check_token(request: Request, call_next):  # noqa: ANN202 (starlette's types)
        if token is not None:
            header = request.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else None
            given = given or request.query_params.get("token")
            if not token_matches(given, token):
                return _error(
                    401,
                    "a token is required: send `Authorization: Bearer TOKEN` "
                    "or add ?token=TOKEN to the URL (the one the server printed).",
                )
        return await call_next(request)

    @app.exception_handler(DashboardError)
    async def dashboard_error(request: Request, e: DashboardError) -> JSONResponse:
        return _error(e.status, str(e))

    @app.exception_handler(RequestValidationError)
    async def bad_query(request: Request, e: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:])}={err.get('input')!r}: {err['msg']}"
            for err in e.errors()
        )
        return _error(400, problems)

    @app.get("/api/info")
    def info() -> Response:
        return SafeJSONResponse(
            {
                "runs_dir": str(runs_dir),
                "auth": token is not None,
                "live_window_s": live_window_s,
                "version": VERSION,
            }
        )

    @app.get("/api/runs")
    def run_list() -> Response:
        run_ids, sweeps = runs.scan()
        rows = [runs.summary(r, sweeps) for r in run_ids]
        return SafeJSONResponse(
            {"runs": rows, "skipped_lines": sum(r["skipped_lines"] for r in rows)}
        )

    @app.get("/api/runs/{run_id:path}/metrics")
    def metrics(
        run_id: str,
        keys: str | None = None,
        max_points: int = 2000,
        since_step: int | None = None,
    ) -> Response:
        return SafeJSONResponse(
            runs.metrics(run_id, _keys(keys), max_points=max_points, since_step=since_step)
        )

    @app.get("/api/runs/{run_id:path}/stream")
    async def stream(
        run_id: str,
        request: Request,
        keys: str | None = None,
        since_step: int = 0,
        max_points: int = 2000,
    ) -> Response:
        await asyncio.to_thread(runs.run_path, run_id)  # 403/404 before the stream starts

        async def events():
            sent, quiet_since = since_step, time.monotonic()
            while not await request.is_disconnected():
                out = await asyncio.to_thread(
                    runs.metrics, run_id, _keys(keys), max_points=max_points, since_step=sent
                )
                if out["last_step"] > sent:
                    sent, quiet_since = out["last_step"], time.monotonic()
                    yield f"event: metrics\ndata: {_dumps(out)}\n\n"
                elif time.monotonic() - quiet_since > STREAM_PING_S:
                    quiet_since = time.monotonic()
                    yield ": ping\n\n"
                await asyncio.sleep(STREAM_POLL_S)

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.get("/api/runs/{run_id:path}/slices")
    def slices(run_id: str) -> Response:
        return SafeJSONResponse(runs.slices(run_id))

    @app.get("/api/runs/{run_id:path}/provenance")
    def data_provenance(run_id: str, step: int, row: int) -> Response:
        return SafeJSONResponse(provenance.locate(run_id, step, row))

    @app.get("/api/runs/{run_id:path}")
    def run_detail(run_id: str) -> Response:
        return SafeJSONResponse(runs.detail(run_id))

    @app.get("/api/compare")
    def compare(
        run_ids: str = Query("", alias="runs"), all_keys: int = Query(0, alias="all")
    ) -> Response:
        return SafeJSONResponse(runs.compare(_keys(run_ids) or [], all_keys=bool(all_keys)))

    @app.get("/api/sweeps")
    def sweeps() -> Response:
        return SafeJSONResponse(sweep_list(runs))

    @app.get("/api/sweeps/{sweep_id:path}")
    def sweep(sweep_id: str) -> Response:
        return SafeJSONResponse(sweep_detail(runs, sweep_id))

    @app.get("/api/{rest:path}")
    def unknown(rest: str) -> Response:
        return _error(404, f"/api/{rest}: no such endpoint; see B_api.md.")

    static = pathlib.Path(static_dir) if static_dir is not None else STATIC_DIR
    if (static / "index.html").is_file():
        # Bazel's runfiles link each file from elsewhere: follow links (the package's own files;
        # `..` is still refused).
        app.mount("/", StaticFiles(directory=static, html=True, follow_symlink=True), name="static")
    else:

        @app.get("/")
        def placeholder() -> HTMLResponse:
            return HTMLResponse(
                "<!doctype html><title>Meltemi dashboard</title><p>The front "
                "end is not installed; the JSON API is at /api/runs.</p>"
            )

    return app
