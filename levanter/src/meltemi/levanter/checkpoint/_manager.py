"""Asynchronous, atomically committed checkpoints with retention and corruption checks.

Layout of a run's checkpoint directory:

    checkpoints/step_00000100/state/...          orbax (OCDBT) arrays, by flattened path
    checkpoints/step_00000100/config/...         the resolved config (JSON)
    checkpoints/step_00000100/meltemi.json       the completion manifest (written last)

Orbax writes each step into a temporary directory and renames it when every array is on
disk; the manifest is written after that rename, so a checkpoint without a manifest is torn
(the process died mid-save) and is never restored. The manifest lists every file with its size
(a missing or truncated file is caught by a `stat`, before anything is read) and, with
`verify="checksums"`, every array's checksum, computed on the devices when the save starts and
checked on the devices after the restore (`_checksum.py`): a file altered later is detected
without reading any file twice, and the previous checkpoint is used instead, with a warning.

The directory may be local or a `gs://` URL: paths are `etils.epath` paths (what orbax uses),
so orbax's metadata and the manifest go through fsspec (`gcsfs`) and the arrays through
tensorstore's own GCS driver. On GCS orbax commits a step with `commit_success.txt` files
instead of a rename; the manifest is still written last, as one object (atomic on GCS).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from meltemi.levanter._private_api import fallback, parameter_names
from meltemi.levanter.checkpoint._checksum import checksums, fetch

logger = logging.getLogger(__name__)

MANIFEST = "meltemi.json"
KINDS = ("temporary", "permanent", "final")
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
    """No usable checkpoint, or a checkpoint that does not fit the state it is restored into."""


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint was torn or corrupt and an earlier one is used instead."""


def is_url(path: str | os.PathLike) -> bool:
    """Whether `path` is an object-store URL (`gs://bucket/dir`) rather than a local path."""
    return "://" in os.fspath(path)


def as_path(path: str | os.PathLike) -> epath.Path:
    """`path` as an `epath.Path` (local paths made absolute; `gs://` URLs kept as they are)."""
    return epath.Path(path) if is_url(path) else epath.Path(os.path.abspath(path))


def step_dir(directory: str | os.PathLike, step: int) -> epath.Path:
    """The directory of the checkpoint taken after `step` steps.

    Example:
        >>> step_dir("/tmp/run/checkpoints", 42).name
        'step_00000042'
    """
    return as_path(directory) / f"step_{step:08d}"


def flatten_state(tree: Any) -> dict[str, Any]:
    """`{"dotted.path": array}` for every array leaf of a pytree (other leaves are static).

    Example:
        >>> import jax.numpy as jnp
        >>> sorted(flatten_state({"params": {"w": jnp.zeros(3)}, "step": jnp.int32(0), "n": 3}))
        ['params.w', 'step']
    """
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)):
            out[jax.tree_util.keystr(path, simple=True, separator=".")] = leaf
    return out


def unflatten_state(template: Any, flat: Mapping[str, Any]) -> Any:
    """Puts `flat`'s arrays back into `template`'s structure (the inverse of `flatten_state`)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    out = []
    for path, leaf in leaves:
        key = jax.tree_util.keystr(path, simple=True, separator=".")
        out.append(flat[key] if key in flat else leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


class _CorruptArrays(Exception):
    """Restored arrays disagree with the checksums in the manifest."""


VERIFY_MODES = ("sizes", "checksums")


def _hash(path: epath.Path) -> str:  # manifests written before checksums recorded SHA-256
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sizes(root: epath.Path) -> dict[str, int]:
    """Size of every file under `root` by its relative name: one listing (one request on an
    object store), not a `stat` per file."""
    fs, base = fsspec.core.url_to_fs(os.fspath(root))
    base = base.rstrip("/")
    try:
        found = fs.find(base, detail=True)
    except FileNotFoundError:
        return {}
    return {
        name[len(base) + 1 :]: int(info["size"])
        for name, info in found.items()
        if info.get("type", "file") == "file" and name.startswith(base + "/")
    }


def _write_json(path: epath.Path, obj: dict) -> None:
    """Writes `obj` so that readers never see half of it: one object on an object store
    (whose writes are atomic), a temporary file renamed over `path` on a local disk."""
    text = json.dumps(obj, indent=1, sort_keys=True)
    if is_url(path):
        path.write_text(text)
        return
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _rmtree(path: epath.Path) -> None:
    try:
        path.rmtree(missing_ok=True)
    except OSError:
        pass


def _write_manifest(root: epath.Path, step: int, kind: str, arrays: dict) -> None:
    files = {name: {"size": size} for name, size in sorted(_sizes(root).items())
             if name != MANIFEST}  # fmt: skip
    manifest = {"step": step, "kind": kind, "time": time.time(), "files": files, "arrays": arrays}
    _write_json(root / MANIFEST, manifest)


def read_manifest(root: str | os.PathLike) -> dict | None:
    """The completion manifest of a checkpoint directory, or None if it is torn."""
    path = as_path(root) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def checkpoint_steps(directory: str | os.PathLike) -> list[int]:
    """Steps with a checkpoint directory under `directory` (complete or not), ascending."""
    root = as_path(directory)
    if not root.is_dir():
        return []
    # Names only (one listing; no request per entry on an object store).
    steps = [_STEP_DIR.match(p.name) for p in root.iterdir()]
    return sorted(int(m.group(1)) for m in steps if m)


def latest_complete_step(directory: str | os.PathLike) -> int | None:
    """The newest step under `directory` with a completion manifest, or None (reads the
    manifests newest first, stopping at the first one found)."""
    for step in reversed(checkpoint_steps(directory)):
        if read_manifest(step_dir(directory, step)):
            return step
    return None


def verify_checkpoint(root: str | os.PathLike) -> str | None:
    """Returns why the checkpoint at `root` is unusable, or None if it looks complete.

    Cheap: reads the manifest and `stat`s every file (array checksums are checked when the
    arrays are restored). Manifests of older versions may list a file's SHA-256: it is checked.
    """
    root = as_path(root)
    manifest = read_manifest(root)
    if manifest is None:
        return f"{root} has no readable {MANIFEST} (the save did not complete)"
    sizes = _sizes(root)
    for name, entry in manifest["files"].items():
        path = root / name
        if name not in sizes:
            return f"{path} is missing"
        if sizes[name] != entry["size"]:
            return f"{path} has {sizes[name]} bytes, the manifest says {entry['size']}"
        if "sha256" in entry and _hash(path) != entry["sha256"]:
            return f"{path} does not match its SHA-256 in the manifest"
    return None


@dataclasses.dataclass(frozen=True)
class RetentionPolicy:
    """When to save and what to keep.

    Attributes:
        save_every_steps: a temporary checkpoint every N steps (0: never by steps).
        save_every_minutes: a temporary checkpoint when M minutes passed since the last one.
        keep_every_steps: steps divisible by K are saved and kept for good (0: none).

    Only the newest temporary checkpoint is kept; permanent and final ones are never deleted.

    Example:
        >>> policy = RetentionPolicy(save_every_steps=10, keep_every_steps=25)
        >>> [policy.kind(s) for s in (10, 25, 30)]
        ['temporary', 'permanent', 'temporary']
    """

    save_every_steps: int = 0
    save_every_minutes: float = 0.0
    keep_every_steps: int = 0

    def kind(self, step: int) -> str | None:
        """The kind of checkpoint due after `step` steps by step count, or None."""
        if self.keep_every_steps and step % self.keep_every_steps == 0:
            return "permanent"
        if self.save_every_steps and step % self.save_every_steps == 0:
            return "temporary"
        return None


class _OrbaxTracebacks(logging.Filter):
    """Shortens orbax's own error logs to their message: a failed save (full disk, read-only
    directory) is reported once, as a `CheckpointError`, not as ~100 lines of traceback from
    orbax's writer threads."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname:
            record.exc_info = None
            record.exc_text = None
        return True


_ORBAX_FILTER = _OrbaxTracebacks()


def broadcast_from_process_0(flag: bool) -> bool:
    """Process 0's `flag` on every process (a collective when there are several processes)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(multihost_utils.broadcast_one_to_all(np.int32(bool(flag))))


# What `release_orbax_threads` relies on in `orbax.checkpoint._src.futures.future`, as of
# orbax-checkpoint 0.12 (the upper bound in levanter/pyproject.toml): a thread built with these
# arguments keeps them as `_receive_signals` and `_operation_id`, `cancel()` makes it return
# once signalled, and `set_signals(signals, operation_id=...)` sends them.
_SIGNALING_INIT = (
    "self", "target", "send_signals", "receive_signals", "timeout_secs", "operation_id", "kwargs"
)  # fmt: skip
_SET_SIGNALS = ("send_signals", "operation_id")
_ORBAX_FALLBACK = (
    "a failed save's orbax commit threads are not released: they wait out orbax's "
    "coordination timeout and keep the process alive that long"
)


def orbax_thread_api() -> Any:
    """orbax's private `future` module, if exactly as tested; else None and one warning."""
    api = "orbax.checkpoint._src.futures.future"
    try:
        from orbax.checkpoint._src.futures import future
    except ImportError as e:
        fallback(api, f"cannot import: {e}", _ORBAX_FALLBACK)
        return None
    thread = getattr(future, "_SignalingThread", None)
    if not (isinstance(thread, type) and issubclass(thread, threading.Thread)):
        fallback(f"{api}._SignalingThread", "missing", _ORBAX_FALLBACK)
        return None
    for name, fn, want in (
        ("_SignalingThread", thread.__init__, _SIGNALING_INIT),
        ("set_signals", getattr(future, "set_signals", None), _SET_SIGNALS),
    ):
        names = None if fn is None else parameter_names(fn)
        if names != want:
            found = "missing" if fn is None else f"parameters {names}"
            fallback(f"{api}.{name}", found, _ORBAX_FALLBACK)
            return None
    # A probe, never started: the attributes read below must hold what was passed.
    try:
        probe = thread(
            target=lambda: None, send_signals=(), receive_signals=(), timeout_secs=1,
            operation_id="meltemi-probe",
        )  # fmt: skip
    except Exception as e:  # on the error path of a failed save: never raise from here
        fallback(f"{api}._SignalingThread", f"cannot be built: {e!r}", _ORBAX_FALLBACK)
        return None
    if (
        getattr(probe, "_receive_signals", None) != ()
        or getattr(probe, "_operation_id", None) != "meltemi-probe"
        or not callable(getattr(probe, "cancel", None))
    ):
        found = "no _receive_signals, _operation_id or cancel"
        fallback(f"{api}._SignalingThread", found, _ORBAX_FALLBACK)
        return None
    return future


def release_orbax_threads() -> int:
    """Lets the commit threads of a failed orbax save end now; returns how many there were.

    Orbax's async save starts non-daemon `_SignalingThread`s that wait for the
    `step_directory_creation` signal before writing. When the save fails before that signal is
    sent (an unwritable directory, a full disk), nothing ever sends it: they wait for the
    coordination timeout (minutes) and keep the process alive after `main` returns. Each is
    cancelled and then sent the signals it waits for, so it wakes, sees the cancellation and
    returns without writing. Orbax has no public call for this (0.12.8): if its private one
    differs from the tested one (`orbax_thread_api`), this warns once and releases none.
    """
    future = orbax_thread_api()
    if future is None:
        return 0
    released = 0
    for thread in threading.enumerate():
        if not isinstance(thread, future._SignalingThread) or not thread.is_alive():
            continue
        thread.cancel()
        if thread._receive_signals:
            future.set_signals(thread._receive_signals, operation_id=thread._operation_id)
        released += 1
    return released


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


class Checkpointer:
    """Saves and restores the train state of one run.

    Args:
        directory: where the `step_XXXXXXXX` directories live.
        policy: when to save and what to keep.
        async_save: write arrays in the background (the step loop only waits for the
            device-to-host copy).
        verify: what the manifest records and restore checks: "sizes" (file sizes) or
            "checksums" (also a checksum of every array, computed and checked on the devices);
            "sha256", the former name, means "checksums".
        clock: seconds, monotonic; `save_every_minutes` reads it (on process 0 only).
        agree: `flag -> flag` that makes every process take process 0's decision (default
            `broadcast_from_process_0`); a time-based save is collective, so all processes
            must decide alike even when their clocks differ.
        orbax_checkpointer: the orbax checkpointer that writes (default: an
            `AsyncCheckpointer` or `Checkpointer` of a `CompositeCheckpointHandler`).

    A save that fails (a full disk, a read-only directory) raises one `CheckpointError`
    naming its step, at the save itself when the failure is synchronous, else at the next
    `due`, `save`, `wait` or `close`. The failed step's partial directory is removed and no
    older checkpoint is pruned, so the previous one stays restorable.

    Example:
        >>> import tempfile, jax.numpy as jnp
        >>> ckpt = Checkpointer(tempfile.mkdtemp(), RetentionPolicy(save_every_steps=2))
        >>> ckpt.save(2, {"w": jnp.arange(3.0)}, config_json="{}")
        >>> ckpt.wait()
        >>> step, state = ckpt.restore({"w": jnp.zeros(3)})
        >>> step, state["w"].tolist()
        (2, [0.0, 1.0, 2.0])
        >>> ckpt.close()
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        policy: RetentionPolicy = RetentionPolicy(),
        *,
        async_save: bool = True,
        verify: str = "checksums",
        clock: Callable[[], float] = time.monotonic,
        agree: Callable[[bool], bool] = broadcast_from_process_0,
        orbax_checkpointer: Any = None,
    ):
        verify = {"sha256": "checksums"}.get(verify, verify)
        if verify not in VERIFY_MODES:
            raise CheckpointError(
                f'checkpoint.verify={verify!r} is not one of {VERIFY_MODES}; use "checksums" '
                f'(array checksums on the devices) or "sizes" (file sizes only)'
            )
        self.directory = as_path(directory)
        self.policy = policy
        self.verify = verify
        self._clock = clock
        self._agree = agree
        logging.getLogger("absl").addFilter(_ORBAX_FILTER)  # once: a filter is added only once
        self._primary = jax.process_index() == 0
        if self._primary:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CheckpointError(
                    f"cannot create the checkpoint directory {self.directory}: {_one_line(e)}; "
                    f"choose a writable run_dir, or set checkpoint.enabled=False"
                ) from None
        if orbax_checkpointer is None:
            handler = ocp.CompositeCheckpointHandler()
            orbax_checkpointer = (
                ocp.AsyncCheckpointer(handler) if async_save else ocp.Checkpointer(handler)
            )
        self._ckptr = orbax_checkpointer
        self._finisher: threading.Thread | None = None
        self._finish_error: tuple[int, BaseException] | None = None
        self._last_save_time = clock()
        self.last_blocking_s = 0.0
        if self._primary:
            self._remove_torn_temporaries()

    def _remove_torn_temporaries(self) -> None:
        # Orbax writes into `<step dir>.orbax-checkpoint-tmp-*` and renames on commit; such
        # directories left behind belong to saves killed midway.
        for path in self.directory.glob("step_*.orbax-checkpoint-tmp*"):
            _rmtree(path)

    # -- saving -------------------------------------------------------------------------------

    def due(self, step: int) -> str | None:
        """The kind of checkpoint to take after `step` steps (by steps or minutes), or None.

        Collective when `save_every_minutes` is set: process 0 reads its clock and every
        process takes its decision. Raises `CheckpointError` if the last save failed.
        """
        self.check()
        kind = self.policy.kind(step)
        if kind is None and self.policy.save_every_minutes > 0:
            elapsed = self._clock() - self._last_save_time
            if self._agree(elapsed >= 60 * self.policy.save_every_minutes):
                kind = "temporary"
        return kind

    def check(self) -> None:
        """Raises the `CheckpointError` of a background save that has failed, if any."""
        if self._finisher is not None and not self._finisher.is_alive():
            self._join()

    def save(self, step: int, state: Any, *, config_json: str, kind: str = "temporary") -> None:
        """Starts saving `state` as the checkpoint after `step` steps; returns once arrays are
        copied off the devices. All processes must call it (it is collective)."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: use one of {KINDS}")
        start = time.perf_counter()
        self._join()
        root = step_dir(self.directory, step)
        if root.exists():
            if read_manifest(root) is not None:
                # Already saved (e.g. a final save right after a periodic one); just re-tag it.
                if self._primary and kind != "temporary":
                    self._retag(root, kind)
                return
            if self._primary:
                _rmtree(root)
        flat = flatten_state(state)
        arrays = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in flat.items()}
        # Dispatched before the arrays can be donated to the next step; fetched in the
        # background, while orbax writes.
        sums = checksums(flat) if self.verify == "checksums" else None
        try:
            self._ckptr.save(
                root,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(flat),
                    config=ocp.args.JsonSave(json.loads(config_json)),
                ),
            )
        except Exception as e:  # a full disk, a read-only directory, ...
            self._discard(root)
            raise self._failure(step, e) from e
        self._last_save_time = self._clock()
        self.last_blocking_s = time.perf_counter() - start
        self._finisher = threading.Thread(
            target=self._finish, args=(root, step, kind, arrays, sums), daemon=False
        )
        self._finisher.start()

    def _finish(
        self, root: epath.Path, step: int, kind: str, arrays: dict, sums: dict | None
    ) -> None:
        try:
            if sums is not None:
                for name, value in fetch(sums).items():
                    arrays[name]["checksum"] = value
            wait = getattr(self._ckptr, "wait_until_finished", None)
            if wait is not None:  # a synchronous `ocp.Checkpointer` committed in `save`
                wait()
            if self._primary:
                _write_manifest(root, step, kind, arrays)
        except BaseException as e:  # surfaced by the next check/due/save/wait
            self._discard(root)
            self._finish_error = (step, e)
            return
        if self._primary:
            self._prune(keep=step)  # only after this step is complete

    def _discard(self, root: epath.Path) -> None:
        release_orbax_threads()
        if not self._primary:
            return
        _rmtree(root)
        for tmp in self.directory.glob(f"{root.name}.orbax-checkpoint-tmp*"):
            _rmtree(tmp)

    def _failure(self, step: int, error: BaseException) -> CheckpointError:
        previous = self.complete_steps() if self._primary else []
        kept = f"step {previous[-1]} is the latest checkpoint" if previous else "none is saved"
        return CheckpointError(
            f"saving the checkpoint of step {step} under {self.directory} failed: "
            f"{_one_line(error)} ({kept}; free space or fix the directory's permissions)"
        )

    def _retag(self, root: epath.Path, kind: str) -> None:
        manifest = read_manifest(root)
        manifest["kind"] = kind
        _write_json(root / MANIFEST, manifest)

    def _prune(self, keep: int) -> None:
        for step in self.all_steps():
            if step == keep:
                continue
            manifest = read_manifest(step_dir(self.directory, step))
            if manifest is not None and manifest["kind"] == "temporary" and step < keep:
                _rmtree(step_dir(self.directory, step))

    def _join(self) -> None:
        if self._finisher is not None:
            self._finisher.join()
            self._finisher = None
        if self._finish_error is not None:
            (step, error), self._finish_error = self._finish_error, None
            raise self._failure(step, error) from error

    def wait(self) -> None:
        """Blocks until the last save is committed (manifest written, old ones pruned)."""
        self._join()

    def close(self) -> None:
        """Waits for pending saves and releases the checkpointer."""
        try:
            self._join()
        finally:
            self._ckptr.close()

    # -- restoring ----------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Steps with a checkpoint directory (complete or not), ascending."""
        return checkpoint_steps(self.directory)

    def complete_steps(self) -> list[int]:
        """Steps whose checkpoint has a completion manifest, ascending."""
        return [s for s in self.all_steps() if read_manifest(step_dir(self.directory, s))]

    def latest_step(self) -> int | None:
        """The newest step with a completion manifest, or None."""
        return latest_complete_step(self.directory)

    def read_config(self, step: int) -> dict:
        """The resolved config saved with the checkpoint of `step`."""
        result = self._ckptr.restore(
            step_dir(self.directory, step), args=ocp.args.Composite(config=ocp.args.JsonRestore())
        )
        return result.config

    def restore(self, template: Any, step: int | None = None) -> tuple[int, Any]:
        """Restores the newest intact checkpoint (or `step`) into `template`'s structure.

        `template`'s array leaves may be arrays or `jax.ShapeDtypeStruct`s; their shardings
        decide where the restored arrays live, so a checkpoint restores onto any mesh.
        A torn or corrupt checkpoint is skipped with a `CorruptCheckpointWarning`.

        Returns:
            `(step, state)`.

        Raises:
            CheckpointError: no intact checkpoint, or one whose arrays differ from `template`.
        """
        self._join()
        candidates = [step] if step is not None else list(reversed(self.all_steps()))
        if not candidates:
            raise CheckpointError(f"no checkpoint under {self.directory}")
        problems = []
        for candidate in candidates:
            root = step_dir(self.directory, candidate)
            problem = verify_checkpoint(root) if root.is_dir() else f"{root} does not exist"
            if problem is None:
                try:
                    return candidate, self._restore_dir(root, template)
                except CheckpointError:
                    raise
                except _CorruptArrays as e:
                    problem = str(e)
                except Exception as e:  # orbax/tensorstore: unreadable data
                    problem = f"{root} could not be read: {type(e).__name__}: {e}"
            problems.append(problem)
            if step is None and len(candidates) > 1:
                warnings.warn(
                    f"skipping checkpoint step {candidate}: {problem}; trying an earlier one.",
                    CorruptCheckpointWarning,
                    stacklevel=2,
                )
        raise CheckpointError(
            f"no intact checkpoint under {self.directory}: " + "; ".join(problems)
        )

    def _restore_dir(self, root: epath.Path, template: Any) -> Any:
        flat = flatten_state(template)
        saved = read_manifest(root)["arrays"]
        if set(saved) != set(flat):
            missing = sorted(set(flat) - set(saved))
            extra = sorted(set(saved) - set(flat))
            raise CheckpointError(
                f"{root} does not fit the train state: missing {missing[:8]}, unexpected "
                f"{extra[:8]}. To start from its weights with another model or optimizer, use "
                f"`--config.checkpoint.init_from={root}` in a new run_dir."
            )
        for key, value in flat.items():
            if list(value.shape) != saved[key]["shape"]:
                raise CheckpointError(
                    f"{root}: array {key} has shape {saved[key]['shape']} in the checkpoint but "
                    f"{list(value.shape)} in the train state; was the model config changed?"
                )
        abstract = {k: _abstract(v) for k, v in flat.items()}
        result = self._ckptr.restore(
            root, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        )
        _check_arrays(root, saved, result.state)
        return unflatten_state(template, result.state)


def array_names(root: str | os.PathLike) -> list[str]:
    """The flattened names of the arrays a complete checkpoint holds."""
    manifest = read_manifest(root)
    if manifest is None:
        raise CheckpointError(f"{root} is not a complete checkpoint (no {MANIFEST}).")
    return sorted(manifest["arrays"])


def restore_arrays(root: str | os.PathLike, wanted: Mapping[str, Any]) -> dict:
    """Restores the arrays of checkpoint `root` named in `wanted` (name -> template).

    Names absent from the checkpoint are left out of the result: callers (warm start)
    initialise and report them. Each array lands on its template's sharding.
    """
    root = as_path(root)
    problem = verify_checkpoint(root)
    if problem is not None:
        raise CheckpointError(f"cannot warm start from {root}: {problem}")
    saved = read_manifest(root)["arrays"]
    abstract = {k: _abstract(v) for k, v in wanted.items() if k in saved}
    for key, value in abstract.items():
        if list(value.shape) != saved[key]["shape"]:
            raise CheckpointError(
                f"cannot warm start {key} from {root}: shape {saved[key]['shape']} there, "
                f"{list(value.shape)} here."
            )
    if not abstract:
        return {}
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
        restore_args = jax.tree.map(
            lambda v: ocp.ArrayRestoreArgs(sharding=v.sharding, dtype=v.dtype), abstract
        )
        restored = reader.restore(
            root / "state",
            args=ocp.args.PyTreeRestore(
                item=abstract, restore_args=restore_args, partial_restore=True
            ),
        )
    try:
        _check_arrays(root, saved, restored)
    except _CorruptArrays as e:
        raise CheckpointError(f"cannot warm start from {root}: {e}") from None
    return restored


def _check_arrays(root: epath.Path, saved: Mapping[str, dict], arrays: Mapping) -> None:
    """Raises `_CorruptArrays` if a restored array differs from its checksum in the manifest."""
    expected = {k: saved[k]["checksum"] for k in arrays if "checksum" in saved.get(k, {})}
    if not expected:
        return
    got = fetch(checksums({k: arrays[k] for k in expected}))
    bad = sorted(k for k in expected if got[k] != expected[k])
    if bad:
        raise _CorruptArrays(
            f"{root}: array {bad[0]} does not match its checksum in the manifest"
            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        )


def _abstract(value: Any) -> jax.ShapeDtypeStruct:
    sharding = getattr(value, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)
