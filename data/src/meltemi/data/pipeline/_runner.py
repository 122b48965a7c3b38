"""Runs a stage's shard tasks on fray actors with a deadline per task, retries, and
quarantine: the stage always finishes, whatever one shard does.

A task that raises is retried on the same actor (the actor is fine); a task that exceeds
`task_timeout_s`, or whose actor dies, costs that actor: it is killed (which stops a hung
task on a `LocalCluster` or Ray) and a fresh one takes its place. After `retries` retries
the task is quarantined: its outcome carries the last error and no result.
"""

from __future__ import annotations

import dataclasses
import importlib
import queue
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from meltemi import fray

__all__ = ["Outcome", "TaskPool", "run_inline", "run_tasks"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one task: its `result`, or (quarantined) the last `error`."""

    key: Any
    result: Any
    error: str | None
    attempts: int


class _StageWorker:
    """The actor: runs one task function at a time.

    Args:
        warm: modules imported by the constructor, so that a stage's first task does not pay
            for them (they load while the other actors start, not inside a stage barrier).
    """

    def __init__(self, warm: tuple[str, ...] = ()):
        for module in warm:
            importlib.import_module(module)

    def run(self, fn: Callable[[Any], Any], item: Any) -> Any:
        return fn(item)


def _describe(e: BaseException, timeout: float) -> str:
    if isinstance(e, fray.CallTimeout):
        return f"timed out after --task_timeout_s={timeout:g} s"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"[:500]


def run_inline(
    fn: Callable[[Any], Any], tasks: list[tuple[Any, Any]], retries: int
) -> Iterator[Outcome]:
    """Runs `fn(item)` for each `(key, item)` in this process, in order, with `retries`
    retries of a task that raises (no deadline: nothing can stop a hung call here)."""
    for key, item in tasks:
        for attempt in range(1, retries + 2):
            try:
                yield Outcome(key, fn(item), None, attempt)
                break
            except Exception as e:  # noqa: BLE001 - a crashing shard must not stop the job
                if attempt == retries + 1:
                    lines = traceback.format_exception_only(e)
                    yield Outcome(key, None, lines[-1].strip()[:500], attempt)


class TaskPool:
    """Actors on `cluster` that run shard tasks, kept across stages (started on first use).

    Args:
        cluster: where the actors live; None runs inline (no deadline can be enforced).
        workers: actors, i.e. tasks at once.
        task_timeout_s: deadline of one attempt.
        retries: attempts after the first before a task is quarantined.
        warm: modules each actor imports when it starts (see `_StageWorker`).

    Actors start together (one `spawn_group`, so `workers` process start-ups overlap) on
    the first `run` that has at least two tasks, and are reused by every later stage. Also an
    `Executor` (`map_unordered`), so `build_store` runs on the same actors; there a
    quarantined task raises, since a store is all of its shards or nothing.
    """

    def __init__(
        self,
        cluster: fray.Cluster | None,
        workers: int,
        task_timeout_s: float,
        retries: int,
        warm: tuple[str, ...] = (),
    ):
        self.cluster = cluster
        self.workers = workers
        self.task_timeout_s = task_timeout_s
        self.retries = retries
        self.warm = tuple(warm)
        self._actors: list = []
        self._prefix = f"pipeline-{uuid.uuid4().hex[:8]}"
        self._serial = iter(range(1 << 30))

    def _fresh(self):
        name = f"{self._prefix}-{next(self._serial)}"
        return self.cluster.spawn(_StageWorker, self.warm, name=name)

    def _grow(self, n: int) -> None:
        """Starts actors until there are `n`, all at once (their start-ups overlap)."""
        missing = n - len(self._actors)
        if missing == 1:
            self._actors.append(self._fresh())
        elif missing > 1:
            name = f"{self._prefix}-{next(self._serial)}"
            # gang=False: a member that times out is killed and replaced alone.
            group = self.cluster.spawn_group(_StageWorker, missing, self.warm, name=name,
                                             gang=False)  # fmt: skip
            self._actors.extend(group)

    def _replace(self, worker):
        try:
            self.cluster.kill(worker)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._actors.remove(worker)
        fresh = self._fresh()
        self._actors.append(fresh)
        return fresh

    def run(self, fn: Callable[[Any], Any], tasks: list[tuple[Any, Any]]) -> Iterator[Outcome]:
        """Runs `fn(item)` for each `(key, item)`; yields an `Outcome` per task as it ends."""
        if not tasks:
            return
        if self.cluster is None:
            yield from run_inline(fn, tasks, self.retries)
            return
        self._grow(min(self.workers, len(tasks)))
        done: queue.Queue = queue.Queue()
        todo = [(key, item, 1) for key, item in reversed(tasks)]  # a stack: pop() is the first

        def submit(worker, job) -> None:
            future = worker.run.options(timeout=self.task_timeout_s).remote(fn, job[1])
            future.add_done_callback(lambda f: done.put((worker, job, f)))

        running = 0
        for worker in list(self._actors):
            if todo:
                submit(worker, todo.pop())
                running += 1
        while running:
            worker, job, future = done.get()
            running -= 1
            key, item, attempt = job
            outcome = None
            try:
                result = future.result()
            except Exception as e:  # noqa: BLE001 - classified below; the job goes on
                if not isinstance(e, fray.RemoteError):  # timed out or died: a fresh actor
                    worker = self._replace(worker)
                if attempt <= self.retries:
                    todo.append((key, item, attempt + 1))
                else:
                    outcome = Outcome(key, None, _describe(e, self.task_timeout_s), attempt)
            else:
                outcome = Outcome(key, result, None, attempt)
            if todo:  # before the caller records the outcome: the actor works meanwhile
                submit(worker, todo.pop())
                running += 1
            if outcome is not None:
                yield outcome

    def map_unordered(self, fn: Callable[[Any], Any], items) -> Iterator[Any]:
        for outcome in self.run(fn, list(enumerate(items))):
            if outcome.error is not None:
                raise RuntimeError(
                    f"task {outcome.key} failed {outcome.attempts} times: {outcome.error}"
                )
            yield outcome.result

    def close(self) -> None:
        for worker in self._actors:
            try:
                self.cluster.kill(worker)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []


def run_tasks(
    fn: Callable[[Any], Any],
    tasks: list[tuple[Any, Any]],
    *,
    cluster: fray.Cluster | None,
    workers: int,
    task_timeout_s: float,
    retries: int,
) -> Iterator[Outcome]:
    """`TaskPool(...).run(fn, tasks)` on a pool of its own, closed at the end."""
    pool = TaskPool(cluster, workers, task_timeout_s, retries)
    try:
        yield from pool.run(fn, tasks)
    finally:
        pool.close()
