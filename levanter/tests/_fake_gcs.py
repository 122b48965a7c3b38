"""A local stand-in for a `gs://` bucket, on both paths a real bucket is reached by.

A run directory `gs://BUCKET/...` is touched by two clients, as in production:

* `etils.epath` -> `fsspec.filesystem("gcs")` (orbax's metadata, the trainer's files): in
  production that is `gcsfs`; here `FakeGcsFileSystem`, an fsspec filesystem registered for
  the `gs`/`gcs` protocols that keeps objects as files under `ROOT/BUCKET/...`;
* tensorstore's native `gcs` kvstore driver (orbax's OCDBT arrays), which speaks the GCS JSON
  API over HTTP: here `FakeGcsServer`, a small HTTP server on 127.0.0.1 serving the same
  `ROOT`, that tensorstore is pointed at with `TENSORSTORE_GCS_HTTP_URL` (and a bearer token
  in `GOOGLE_AUTH_TOKEN_FOR_TESTING`, checked on every request).

It implements what tensorstore uses: media upload (`ifGenerationMatch`), media and byte-range
download (`x-goog-generation`, `ifGenerationNotMatch`), object metadata, delete and listing
(`startOffset`/`endOffset`/`prefix`). Generations are the file's `st_mtime_ns`.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import threading
import urllib.parse

from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

ROOT_ENV = "MELTEMI_FAKE_GCS_ROOT"


class FakeGcsFileSystem(DirFileSystem):
    """`gs://BUCKET/KEY` as the file `$MELTEMI_FAKE_GCS_ROOT/BUCKET/KEY` (fsspec)."""

    protocol = ("gs", "gcs")

    def __init__(self, *args, **kwargs):
        del args, kwargs  # gcsfs options (e.g. finalize_on_close) mean nothing here
        # auto_mkdir: like an object store, writing a key needs no directory first.
        super().__init__(path=os.environ[ROOT_ENV], fs=LocalFileSystem(auto_mkdir=True))

    @classmethod
    def _strip_protocol(cls, path):
        path = path[0] if isinstance(path, list) else path
        for prefix in ("gs://", "gcs://"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
        return path.rstrip("/")

    def _join(self, path):
        if isinstance(path, str):
            path = self._strip_protocol(path)
        elif isinstance(path, list):
            path = [self._strip_protocol(p) for p in path]
        return super()._join(path)


def install_filesystem(root: str) -> None:
    """Registers `FakeGcsFileSystem` for `gs://` and `gcs://` in this process, over `root`."""
    import fsspec

    os.environ[ROOT_ENV] = str(root)
    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, FakeGcsFileSystem, clobber=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeGcsServer

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        with self.server.lock:
            key = f"{self.command} {status}"
            self.server.statuses[key] = self.server.statuses.get(key, 0) + 1
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _json(self, status: int, obj: dict) -> None:
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _route(self) -> tuple[str, str, dict] | None:
        """(bucket, object name or "", query) after checking the bearer token."""
        with self.server.lock:
            self.server.requests[self.command] = self.server.requests.get(self.command, 0) + 1
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._send(401)
            return None
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        parts = url.path.split("/")
        # /storage/v1/b/B/o[/NAME] or /upload/storage/v1/b/B/o
        i = parts.index("b")
        bucket = parts[i + 1]
        name = urllib.parse.unquote("/".join(parts[i + 3 :])) if len(parts) > i + 3 else ""
        return bucket, name or query.get("name", ""), query

    def _file(self, bucket: str, name: str) -> str:
        path = os.path.normpath(os.path.join(self.server.root, bucket, name))
        if not path.startswith(os.path.join(self.server.root, "")):
            raise PermissionError(name)
        return path

    def _meta(self, bucket: str, name: str, path: str) -> dict:
        st = os.stat(path)
        return {"bucket": bucket, "name": name, "size": str(st.st_size),
                "generation": str(st.st_mtime_ns), "metageneration": "1"}  # fmt: skip

    @staticmethod
    def _precondition_failed(query: dict, generation: int) -> bool:
        match = query.get("ifGenerationMatch")
        return match is not None and int(match) != generation

    def do_GET(self):  # noqa: N802 (http.server's naming)
        route = self._route()
        if route is None:
            return
        bucket, name, query = route
        if not name:
            return self._list(bucket, query)
        path = self._file(bucket, name)
        if not os.path.isfile(path):
            return self._send(404)
        meta = self._meta(bucket, name, path)
        generation = int(meta["generation"])
        if self._precondition_failed(query, generation):
            return self._send(412)
        if query.get("ifGenerationNotMatch") == str(generation):
            return self._send(304, headers={"x-goog-generation": str(generation)})
        if query.get("alt") != "media":
            return self._json(200, meta)
        with open(path, "rb") as f:
            data = f.read()
        headers = {"x-goog-generation": str(generation)}
        spec = self.headers.get("Range")
        if spec and spec.startswith("bytes="):
            first, _, last = spec[len("bytes=") :].partition("-")
            if first == "":
                start, stop = max(len(data) - int(last), 0), len(data)
            else:
                start = int(first)
                stop = min(int(last) + 1, len(data)) if last else len(data)
            if start >= len(data) and len(data):
                return self._send(416, headers=headers)
            headers["Content-Range"] = f"bytes {start}-{max(stop - 1, start)}/{len(data)}"
            return self._send(206, data[start:stop], headers)
        self._send(200, data, headers)

    def _list(self, bucket: str, query: dict) -> None:
        root = os.path.join(self.server.root, bucket)
        names = []
        for directory, _, files in os.walk(root):
            for f in files:
                names.append(os.path.relpath(os.path.join(directory, f), root))
        start, end = query.get("startOffset", ""), query.get("endOffset")
        prefix = query.get("prefix", "")
        chosen = sorted(n for n in names if n >= start and (end is None or n < end)
                        and n.startswith(prefix))  # fmt: skip
        items = [self._meta(bucket, n, os.path.join(root, n)) for n in chosen]
        self._json(200, {"kind": "storage#objects", "items": items})

    def do_POST(self):  # noqa: N802
        route = self._route()
        if route is None:
            return
        bucket, name, query = route
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self._file(bucket, name)
        with self.server.lock:
            generation = os.stat(path).st_mtime_ns if os.path.isfile(path) else 0
            if self._precondition_failed(query, generation):
                return self._send(412)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.upload-{secrets.token_hex(4)}"
            with open(tmp, "wb") as f:
                f.write(body)
            os.replace(tmp, path)
        self._json(200, self._meta(bucket, name, path))

    def do_DELETE(self):  # noqa: N802
        route = self._route()
        if route is None:
            return
        bucket, name, query = route
        path = self._file(bucket, name)
        with self.server.lock:
            if not os.path.isfile(path):
                return self._send(404)
            if self._precondition_failed(query, os.stat(path).st_mtime_ns):
                return self._send(412)
            os.remove(path)
        self._send(204)


class FakeGcsServer(http.server.ThreadingHTTPServer):
    """The GCS JSON API subset tensorstore uses, over `root`, on 127.0.0.1.

    Example:
        with FakeGcsServer(tmp_path) as server:
            env.update(server.env())   # for a subprocess (or os.environ for this one)
    """

    daemon_threads = True

    def __init__(self, root: str | os.PathLike):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = os.path.abspath(root)
        self.token = secrets.token_hex(16)
        self.lock = threading.Lock()
        #: Requests served, by HTTP method (what tensorstore sent here).
        self.requests: dict[str, int] = {}
        #: Responses, by "METHOD STATUS".
        self.statuses: dict[str, int] = {}
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def env(self) -> dict[str, str]:
        """What points tensorstore (and `install_filesystem` in a child process) here."""
        return {
            "TENSORSTORE_GCS_HTTP_URL": f"http://127.0.0.1:{self.server_port}",
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": self.token,
            ROOT_ENV: self.root,
        }

    def __enter__(self) -> FakeGcsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
