"""meltemi.fray: a small, fast, authenticated RPC actor runtime.

One API, three backends: `InProcessCluster` (threads), `LocalCluster` (one process per actor,
authenticated loopback TCP) and `meltemi.fray.ray.RayCluster` (the `ray` extra).

Example:
    >>> from meltemi import fray
    >>> class Greeter:
    ...     def hello(self, who):
    ...         return f"hello {who}"
    >>> with fray.InProcessCluster() as cluster:
    ...     greeter = cluster.spawn(Greeter)
    ...     greeter.hello("fray")
    'hello fray'
"""

from meltemi.fray._cluster import Cluster
from meltemi.fray._config import Resources, RestartPolicy
from meltemi.fray._context import ActorContext, actor_context, free_port
from meltemi.fray._errors import (
    ActorDied,
    ActorRestarted,
    AuthenticationError,
    CallTimeout,
    ConnectionLost,
    FrayError,
    ProtocolError,
    RemoteError,
)
from meltemi.fray._future import Future, wait_all
from meltemi.fray._handle import ActorGroup, ActorHandle, ActorInfo, ActorMethod
from meltemi.fray._inprocess import InProcessCluster
from meltemi.fray._local import LocalCluster
from meltemi.fray._methods import idempotent

__version__ = "0.1.0"

__all__ = [
    "ActorContext",
    "ActorDied",
    "ActorGroup",
    "ActorHandle",
    "ActorInfo",
    "ActorMethod",
    "ActorRestarted",
    "AuthenticationError",
    "CallTimeout",
    "Cluster",
    "ConnectionLost",
    "FrayError",
    "Future",
    "InProcessCluster",
    "LocalCluster",
    "ProtocolError",
    "RemoteError",
    "Resources",
    "RestartPolicy",
    "__version__",
    "actor_context",
    "free_port",
    "idempotent",
    "wait_all",
]
