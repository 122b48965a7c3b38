"""`SliceWorker`: one slice of a multislice job, a process joined to the others by
`jax.distributed` on loopback (CPU collectives over gloo)."""

from __future__ import annotations

import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from meltemi.levanter._private_api import fallback, parameter_names
from meltemi.levanter.config import ResolvedConfig, RunSpec, resolve
from meltemi.levanter.trainer import Hook, Preemption, install_sigterm_handler, train

#: Signal from the launcher: "stop at the next step boundary and save" so the gang can
#: re-form at a new size (a replacement slice is ready to join).
RESIZE_SIGNAL = signal.SIGUSR1

# This process got SIGTERM itself (its slice is being preempted), or the launcher asked the
# gang to stop for a resize. Either also sets the trainer's stop flag: all slices agree to
# stop at the same step and save a checkpoint there.
_TERMINATED = threading.Event()
_RESIZE = threading.Event()


def _install_handlers() -> None:
    if not install_sigterm_handler():  # not the main thread: signals stay as they are
        return
    stop = signal.getsignal(signal.SIGTERM)  # the trainer's: sets its stop flag

    def on_sigterm(signum, frame):
        _TERMINATED.set()
        stop(signum, frame)

    def on_resize(signum, frame):
        _RESIZE.set()
        stop(signal.SIGTERM, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(RESIZE_SIGNAL, on_resize)


# The private JAX names `write_compile_cache_from_every_rank` relies on, as of jax 0.10 (the
# upper bound in levanter/pyproject.toml): `compiler._cache_write` is replaced and called with
# these arguments, `compilation_cache.put_executable_and_time` is called with these.
_CACHE_WRITE_PARAMS = (
    "cache_key", "compile_time_secs", "module_name", "backend", "executable", "host_callbacks"
)  # fmt: skip
_PUT_PARAMS = ("cache_key", "module_name", "executable", "backend", "compile_time")
_CACHE_WRITE = "jax._src.compiler._cache_write"
_CACHE_FALLBACK = (
    "only process 0 writes compile-cache entries, as in JAX (on CPU, ranks >= 1 of a gang "
    "recompile at every re-form)"
)


class _CacheHooks(NamedTuple):
    compiler: Any  # jax._src.compiler
    put: Callable[..., None]  # jax._src.compilation_cache.put_executable_and_time
    global_state: Any  # jax._src.distributed.global_state


def jax_cache_hooks() -> _CacheHooks | None:
    """JAX's private compile-cache hooks, if exactly as tested; else None and one warning."""
    try:
        from jax._src import compilation_cache, compiler, distributed
    except ImportError as e:
        fallback("jax._src", f"cannot import: {e}", _CACHE_FALLBACK)
        return None
    original = getattr(compiler, "_cache_write", None)
    put = getattr(compilation_cache, "put_executable_and_time", None)
    state = getattr(distributed, "global_state", None)
    for api, found, want in (
        (_CACHE_WRITE, original, _CACHE_WRITE_PARAMS),
        ("jax._src.compilation_cache.put_executable_and_time", put, _PUT_PARAMS),
    ):
        names = None if found is None else parameter_names(found)
        if names != want:
            fallback(api, "missing" if found is None else f"parameters {names}", _CACHE_FALLBACK)
            return None
    if not isinstance(getattr(state, "process_id", None), int):
        fallback("jax._src.distributed.global_state.process_id", "missing", _CACHE_FALLBACK)
        return None
    return _CacheHooks(compiler, put, state)


def write_compile_cache_from_every_rank() -> bool:
    """Lets every process of the gang write its own persistent compilation cache entries.

    JAX writes entries only from process 0, and on CPU a process's cache key includes its
    topology fingerprint, which differs per process: ranks >= 1 never found an entry and
    compiled every step from scratch at each re-form (14 s of a 23 s shrink on this machine).
    Their keys are distinct files, so writing them does not contend with process 0's. On other
    platforms the keys are the same on every process and only process 0 writes, as in JAX.
    JAX has no public hook for this: if its private one differs from the tested signature
    (`jax_cache_hooks`), this warns once, changes nothing and returns False.
    """
    hooks = jax_cache_hooks()
    if hooks is None:
        return False
    original = hooks.compiler._cache_write
    if getattr(original, "_every_rank", False):
        return True
    put, state = hooks.put, hooks.global_state

    def cache_write(cache_key, compile_time_secs, module_name, backend, executable,
                    host_callbacks):  # fmt: skip
        # Only CPU keys differ per process; on GPU/TPU every rank has the same key, and JAX's
        # one writer (process 0) is right: many writers of one object would contend.
        cpu = getattr(backend, "platform", "") == "cpu"
        if state.process_id == 0 or host_callbacks or not cpu:
            return original(cache_key, compile_time_secs, module_name, backend, executable,
                            host_callbacks)  # fmt: skip
        if compile_time_secs < jax.config.jax_persistent_cache_min_compile_time_secs:
            return None
        try:
            put(cache_key, module_name, executable, backend, int(compile_time_secs))
        except Exception as e:  # a full disk must not stop training
            print(f"compile cache: could not write {module_name}: {e}", file=sys.stderr)
        return None

    cache_write._every_rank = True
    hooks.compiler._cache_write = cache_write
    return True


def peak_rss_mb() -> float:
    """The peak resident memory of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class SliceWorker:
    """One slice of a multislice job: a process holding that slice's devices.

    A worker runs one gang (`run`) and is then replaced: `jax.distributed` cannot change its
    process count in place, so a gang of a new size is a new set of processes. Constructing
    one imports JAX and the trainer but touches no backend, so the launcher keeps spares
    waiting (a warm standby) and assigns them with `run`.
    """

    def __init__(self):
        # The constructor runs in the actor process's main thread, calls in worker threads:
        # only here can SIGTERM be turned into "save a checkpoint and stop".
        _install_handlers()

    def info(self) -> dict[str, Any]:
        """This process's pid (the launcher's status and signals need it on every backend)."""
        return {"pid": os.getpid()}

    def run(
        self,
        slice_index: int,
        rank: int,
        num_slices: int,
        coordinator: str,
        config_json: str,
        local_devices: int,
        compile_cache: str = "",
        hooks: Callable[[RunSpec], Sequence[Hook]] | None = None,
    ) -> dict[str, Any]:
        """Joins a gang of `num_slices` processes as `rank`, trains (or resumes) and reports.

        Args:
            slice_index: the slice this process holds (stable across re-forms).
            rank: its place in this gang (the `jax.distributed` process id).
            num_slices: the gang's size (the mesh is built for this many slices).
            coordinator: `host:port` of the `jax.distributed` coordinator.
            config_json: the job's `ResolvedConfig`, as JSON.
            local_devices: devices of this process.
            compile_cache: a persistent compilation cache directory ("" for none): a gang
                re-formed at a size seen before starts without compiling.
            hooks: `hooks(spec)` -> the step-boundary hooks to add to this slice's trainer
                (a module-level function: it is pickled by reference), or None.
        """
        os.environ["MELTEMI_SLICE_INDEX"] = str(slice_index)
        # The launcher's fake-device flag (tests) must not leak into the slice processes:
        # each slice has `local_devices` devices.
        flags = os.environ.get("XLA_FLAGS", "").split()
        flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
        os.environ["XLA_FLAGS"] = " ".join(flags)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if compile_cache:
            jax.config.update("jax_compilation_cache_dir", compile_cache)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
            write_compile_cache_from_every_rank()
        if jax.config.jax_platforms in (None, "", "cpu"):
            jax.config.update("jax_num_cpu_devices", local_devices)
        start = time.perf_counter()
        resolved = ResolvedConfig.from_json(config_json)
        resolved.config.mesh.num_slices = num_slices  # this gang's size (target: the launcher's)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_slices,
            process_id=rank,
            initialization_timeout=120,
        )
        joined = time.perf_counter()
        print(f"slice {slice_index}: rank {rank} of {num_slices}, joined in "
              f"{joined - start:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
        result = train(resolved, hooks=hooks(resolve(resolved)) if hooks is not None else ())
        print(f"slice {slice_index}: trained steps {result.start_step}-{result.step} in "
              f"{time.perf_counter() - joined:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
        jax.distributed.shutdown()
        return {
            "slice": slice_index,
            "start_step": result.start_step,
            "step": result.step,
            "preempted": result.preempted,
            # This process was asked to stop (SIGTERM: its slice is preempted) other than by
            # a resize. Calls may run in the main thread, where the loop's `Preemption`
            # handles SIGTERM itself, so its flag is read, not only ours.
            "terminated": (_TERMINATED.is_set() or Preemption().requested) and not _RESIZE.is_set(),
            "resized": _RESIZE.is_set(),
            "losses": result.losses,
            "summary": result.summary,
            "peak_rss_mb": peak_rss_mb(),
        }
