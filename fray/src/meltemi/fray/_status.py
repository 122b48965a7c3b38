"""`fray:status`: lists the actors of running LocalClusters (state, restarts, calls, latency).

Every LocalCluster serves a small controller next to its actors and records its address in
`<cluster dir>/cluster.json`; this tool reads that, authenticates with the cluster's secret
(so only the cluster's user can look) and asks the controller for `cluster.actors()`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from meltemi.fray._errors import FrayError
from meltemi.fray._future import Future
from meltemi.fray._handle import ActorInfo
from meltemi.fray._local import LocalCluster, cluster_root
from meltemi.fray._server import ClientConnection, encode_call
from meltemi.fray._wire import DEFAULT_MAX_FRAME_BYTES, read_secret

__all__ = ["fetch_actors", "format_table", "list_clusters", "main"]

_COLUMNS = ("name", "cls", "state", "epoch", "failures", "preemptions", "pid", "calls",
            "errors", "p50_us", "p99_us")  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_clusters(root: str | None = None) -> list[str]:
    """Directories of the LocalClusters of this user whose driver process is alive."""
    root = root or cluster_root()
    found = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    for name in names:
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, "cluster.json")) as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        if _alive(int(info["pid"])):
            found.append(path)
    return found


def fetch_actors(cluster_dir: str, timeout: float = 10.0) -> list[ActorInfo]:
    """Asks the cluster in `cluster_dir` for its actors (authenticated with its secret)."""
    with open(os.path.join(cluster_dir, "cluster.json")) as f:
        info = json.load(f)
    secret = read_secret(os.path.join(cluster_dir, "secret"))
    address = tuple(info["controller"])
    conn = ClientConnection(
        address, secret, name="controller", max_frame_bytes=DEFAULT_MAX_FRAME_BYTES
    )
    try:
        deadline = time.monotonic() + timeout
        header, payload = encode_call("actors", [], time.time() + timeout, None, timeout)
        fut = Future("controller", "actors", deadline, timeout)
        conn.request(header, payload, fut)
        rows = fut.result()
    finally:
        conn.close()
    return [ActorInfo(**row) for row in rows]


def format_table(rows: list[ActorInfo]) -> str:
    """A fixed-width table of actor rows.

    Example:
        >>> row = ActorInfo("w/0", "Worker", "alive", 1, 1, 0, 4242, ("127.0.0.1", 5), 9, 0,
        ...                 61.0, 240.5, "w")
        >>> print(format_table([row]))
        name  cls     state  epoch  failures  preemptions  pid   calls  errors  p50_us  p99_us
        w/0   Worker  alive  1      1         0            4242  9      0       61      240
    """
    table = [list(_COLUMNS)]
    for r in rows:
        d = r._asdict()
        table.append(
            [
                f"{d[c]:.0f}" if isinstance(d[c], float) else ("-" if d[c] is None else str(d[c]))
                for c in _COLUMNS
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table
    )


class _Demo:
    def work(self, n: int) -> int:
        return sum(range(n))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fray:status", description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", help="a cluster directory (default: every running one)")
    parser.add_argument("--root", help=f"where clusters live (default: {cluster_root()})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--demo", action="store_true", help="start a small cluster, call it, and show it"
    )
    args = parser.parse_args(argv)
    if args.demo:
        with LocalCluster() as cluster:
            group = cluster.spawn_group(_Demo, 2, name="demo")
            for _ in range(50):
                [f.result() for f in group.call("work", 1000)]
            time.sleep(1.2)  # one heartbeat carries the call statistics
            return _show([cluster.dir], args.json)
    dirs = [args.cluster] if args.cluster else list_clusters(args.root)
    if not dirs:
        print(
            f"no running fray LocalCluster under {args.root or cluster_root()} "
            "(run with --demo to see one)"
        )
        return 0
    return _show(dirs, args.json)


def _show(dirs: list[str], as_json: bool) -> int:
    status = 0
    out = {}
    for d in dirs:
        try:
            rows = fetch_actors(d)
        except (OSError, FrayError) as e:
            print(f"{d}: cannot reach its controller: {e}", file=sys.stderr)
            status = 1
            continue
        if as_json:
            out[d] = [r._asdict() for r in rows]
        else:
            print(f"cluster {d} ({len(rows)} actors)")
            print(format_table(rows))
    if as_json:
        print(json.dumps(out, indent=1))
    return status
