"""The entry point of a LocalCluster actor process: `python -m meltemi.fray._worker FD`.

FD is one end of a socketpair whose other end the supervisor holds (the "life line"). Over
it, and only over it, the process receives its spec (the pickled class and arguments; the
socketpair is private to the two processes, so this is the one pickle read before a
handshake) and reports `{"port", "pid"}` once its server listens. When the supervisor goes
away or closes the line, the actor exits; when the actor dies, the supervisor sees EOF.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback

import cloudpickle
import msgpack

from meltemi.fray._context import ActorContext, set_context
from meltemi.fray._loop import IOLoop
from meltemi.fray._methods import Dispatcher
from meltemi.fray._server import Server
from meltemi.fray._wire import read_secret, recv_frame, send_frame

_SPEC_MAX_BYTES = 1 << 31


def _exit_now(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str]) -> None:
    life = socket.socket(fileno=int(argv[0]))
    life.set_inheritable(False)
    parts = recv_frame(life, _SPEC_MAX_BYTES)
    spec = msgpack.unpackb(parts[0])
    ctx = ActorContext(
        name=spec["name"],
        rank=spec["rank"],
        group_size=spec["group_size"],
        group=spec["group"],
        epoch=spec["epoch"],
        backend="local",
    )
    set_context(ctx, process=True)
    try:
        secret = read_secret(spec["secret_path"])
        cls, args, kwargs = cloudpickle.loads(parts[1])
        instance = cls(*args, **kwargs)
        server = Server(
            Dispatcher(instance, spec["name"]),
            secret,
            host=spec["host"],
            max_frame_bytes=spec["max_frame_bytes"],
            max_concurrency=spec["max_concurrency"],
        )
    except BaseException as e:
        traceback.print_exc()
        message = f"{type(e).__name__}: {e}"
        send_frame(life, [msgpack.packb({"error": message})], _SPEC_MAX_BYTES)
        _exit_now(1)
    send_frame(life, [msgpack.packb({"port": server.address[1], "pid": os.getpid()})], 1 << 20)

    def on_life_line() -> None:
        try:
            data = life.recv(4096)
        except OSError:
            data = b""
        if not data:  # the supervisor stopped us or went away
            _exit_now(0)

    IOLoop.get().add_reader(life, on_life_line)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
