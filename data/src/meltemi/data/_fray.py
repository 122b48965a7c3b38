"""Build work on a `meltemi.fray` cluster: one actor per worker, tasks fed as workers free up."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from meltemi import fray

__all__ = ["FrayExecutor"]

_END = object()  # end of the items (None is an item like any other)
_TASK_TIMEOUT_S = 24 * 3600.0  # a shard of a huge file may take long; the ledger bounds the loss


class _BuildWorker:
    """The actor: runs one task function at a time."""

    def run(self, fn: Callable[[Any], Any], item: Any) -> Any:
        return fn(item)


class FrayExecutor:
    """Runs build tasks on `workers` fray actors (a `LocalCluster` unless `cluster` is given).

    Results come back in completion order. When a task fails, no new task starts, the running
    ones finish (their results are still yielded, so the build records them in its ledger),
    then the first error is raised; a rerun resumes after the recorded shards.

    >>> with fray.InProcessCluster() as cluster:
    ...     sorted(FrayExecutor(2, cluster=cluster).map_unordered(abs, [-3, 1, -2]))
    [1, 2, 3]
    """

    def __init__(self, workers: int, *, cluster: fray.Cluster | None = None):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"FrayExecutor(workers={workers!r}): need an int >= 1")
        self.workers = workers
        self.cluster = cluster

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        items = list(items)
        if not items:
            return
        own = self.cluster is None
        cluster = fray.LocalCluster() if own else self.cluster
        try:
            n = min(self.workers, len(items))
            group = cluster.spawn_group(_BuildWorker, n, name=f"data-build-{uuid.uuid4().hex[:8]}")
            done: queue.Queue = queue.Queue()
            todo = iter(items)

            def submit(worker) -> bool:
                item = next(todo, _END)
                if item is _END:
                    return False
                future = worker.run.options(timeout=_TASK_TIMEOUT_S).remote(fn, item)
                future.add_done_callback(lambda f, w=worker: done.put((w, f)))
                return True

            running = sum(submit(w) for w in group)
            error: BaseException | None = None
            try:
                # After a failure, submit nothing new but let running tasks finish (their
                # results still reach the caller), so no task outlives this call.
                while running:
                    worker, future = done.get()
                    running -= 1
                    try:
                        result = future.result()
                    except Exception as e:
                        error = error or e
                        continue
                    if error is None:
                        running += submit(worker)
                    yield result
            finally:
                cluster.kill(group)
            if error is not None:
                raise error
        finally:
            if own:
                cluster.shutdown()
