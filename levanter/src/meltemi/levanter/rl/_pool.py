"""The trainer's side of the rollout workers: dispatch, weight sync, and lost workers.

`RolloutPool` spawns `num_workers` `RolloutWorker` actors on a fray cluster (each restarts
alone under its `RestartPolicy`), hands out chunks of numbered prompts to idle workers, and
collects the groups they return. A worker that dies (SIGKILL, OOM, a lost host) takes its
chunk back to the front of the queue; its restarted incarnation is sent the current weights
before its next chunk, so the run goes on with the same prompts and the same weights.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meltemi import fray
from meltemi.levanter.envs import Prompt
from meltemi.levanter.rl._rollout import Group, RolloutWorker, WorkerSpec, payload_bytes


class RolloutError(RuntimeError):
    """Every rollout worker is gone (its restart budget spent) or a worker has a bug."""


class RolloutPool:
    """Rollout workers on `cluster`, and the chunks of prompts they are working on.

    Args:
        cluster: a fray cluster (`LocalCluster`, `InProcessCluster`, `RayCluster`).
        spec: what each worker builds.
        weights: every array of the policy at `version` (the workers start from them).
        num_workers: workers to spawn.
        restart: each worker's restart policy.
        version: the weights' version.
    """

    def __init__(
        self,
        cluster: Any,
        spec: WorkerSpec,
        weights: Mapping[str, np.ndarray],
        *,
        num_workers: int,
        restart: fray.RestartPolicy,
        version: int = 0,
    ):
        self.group = cluster.spawn_group(
            RolloutWorker, num_workers, spec, dict(weights), version,
            name="rollout", restart=restart, gang=False,
        )  # fmt: skip
        self.workers = list(self.group)
        self.version = version
        self._payload: Mapping[str, np.ndarray] = weights
        self._stale = [False] * num_workers  # restarted: holds the first weights
        self._alive = [True] * num_workers
        self._inflight: dict[int, tuple[fray.Future, list[tuple[int, Prompt]], int]] = {}
        self._pending: collections.deque[tuple[list[tuple[int, Prompt]], bool]] = (
            collections.deque()
        )
        self._acks: list[tuple[int, fray.Future]] = []
        self._event = threading.Event()
        self.lost = 0  # worker deaths seen
        self.apply_s: list[float] = []  # workers' seconds installing weights (since last read)

    # -- weights ---------------------------------------------------------------------------
    def sync(self, payload: Mapping[str, np.ndarray], version: int) -> tuple[float, int]:
        """Sends new weights to every worker (after its current chunk); returns the caller's
        seconds and the bytes sent (payload bytes times workers)."""
        start = time.perf_counter()
        self._payload, self.version = payload, version
        sent = 0
        for i, handle in enumerate(self.workers):
            if self._alive[i]:
                ack = handle.set_weights.options(timeout=None).remote(payload, version)
                self._acks.append((i, ack))
                sent += 1
        return time.perf_counter() - start, payload_bytes(payload) * sent

    # -- prompts ---------------------------------------------------------------------------
    def request(self, prompts: Sequence[tuple[int, Prompt]], *, greedy: bool = False) -> None:
        """Queues numbered prompts; idle workers take them at the current version."""
        self._pending.append((list(prompts), greedy))
        self._pump()

    def _pump(self) -> None:
        for i, handle in enumerate(self.workers):
            if not self._pending:
                return
            if not self._alive[i] or i in self._inflight:
                continue
            chunk, greedy = self._pending.popleft()
            if self._stale[i]:
                handle.set_weights.options(timeout=None).remote(self._payload, self.version)
                self._stale[i] = False
            future = handle.generate.options(timeout=None).remote(
                chunk, self.version, greedy=greedy
            )
            future.add_done_callback(lambda _: self._event.set())
            self._inflight[i] = (future, chunk, greedy)

    @property
    def busy(self) -> bool:
        """Chunks are queued or being generated."""
        return bool(self._inflight or self._pending)

    def poll(self, timeout: float = 1.0) -> list[Group]:
        """Groups of the chunks finished since the last call (waits up to `timeout` for one)."""
        self._collect_acks()
        if not any(f.done() for f, _, _ in self._inflight.values()):
            self._event.clear()
            if not any(f.done() for f, _, _ in self._inflight.values()):
                self._event.wait(timeout)
        out: list[Group] = []
        for i in [i for i, (f, _, _) in self._inflight.items() if f.done()]:
            future, chunk, greedy = self._inflight.pop(i)
            try:
                out += future.result()
            except (fray.ActorDied, fray.ActorRestarted, fray.ConnectionLost) as e:
                self.lost += 1
                self._pending.appendleft((chunk, greedy))
                restarts = isinstance(e, fray.ActorRestarted) or getattr(e, "will_restart", True)
                self._alive[i] = bool(restarts)
                self._stale[i] = True
                if not any(self._alive):
                    raise RolloutError(
                        f"every rollout worker is lost (the last: {e}); raise "
                        "rl.worker_restarts or check the workers' logs"
                    ) from e
            except fray.RemoteError as e:
                raise RolloutError(f"rollout worker {i} failed: {e}") from e
        self._pump()
        return out

    def _collect_acks(self) -> None:
        keep = []
        for i, ack in self._acks:
            if not ack.done():
                keep.append((i, ack))
                continue
            try:
                self.apply_s.append(float(ack.result()))
            except (fray.ActorDied, fray.ActorRestarted, fray.ConnectionLost):
                self._stale[i] = True  # its restart is sent the weights with its next chunk
        self._acks = keep

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [h.pid() for h in self.workers]
