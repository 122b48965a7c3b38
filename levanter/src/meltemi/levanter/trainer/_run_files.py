"""A run directory on a local disk or in an object store (`gs://bucket/run`).

Checkpoints, `config.json` and `warm_start.txt` are written to the run directory itself
(orbax and `etils.epath` speak `gs://`). The files a run *appends to* step by step
(`metrics.jsonl`, TensorBoard events, the profile, the loss curve; also the Hugging Face
exports of `checkpoint.export_hf`, which `meltemi.models.hf.save` writes locally) cannot be
appended to in an object store, whose objects are written whole: for a `gs://` run they are
written to a local working copy and uploaded (fsspec `put`) after every checkpoint and at the
end of the run, the way MaxText uploads its metrics; a resumed run first downloads them
(fsspec `get`), so `metrics.jsonl` continues where the checkpoint left it.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tempfile

import fsspec

from meltemi.levanter.checkpoint import is_url

#: What is kept in the local working copy of a `gs://` run (and uploaded from it).
STREAMED = ("metrics.jsonl", "tensorboard", "profile", "loss.png", "wandb_id.txt", "hf")


class RunFiles:
    """Where the files of a run go.

    Attributes:
        run_dir: the run directory (a local path or a `gs://` `epath.Path`).
        local: where the streamed files are written: `run_dir` itself when it is local, else a
            local working copy that `push` uploads to `run_dir`.

    Example:
        >>> import tempfile, pathlib
        >>> files = RunFiles(pathlib.Path(tempfile.mkdtemp()))
        >>> files.local == files.run_dir, files.remote
        (True, False)
    """

    def __init__(self, run_dir: os.PathLike, workdir: str | os.PathLike | None = None):
        self.run_dir = run_dir
        self.remote = is_url(run_dir)
        if not self.remote:
            self.local = pathlib.Path(run_dir)
            return
        digest = hashlib.sha256(os.fspath(run_dir).encode()).hexdigest()[:12]
        root = pathlib.Path(workdir or os.path.join(tempfile.gettempdir(), "meltemi-runs"))
        self.local = root / digest
        self._fs, self._base = fsspec.core.url_to_fs(os.fspath(run_dir))
        self._uploaded: dict[pathlib.Path, tuple[int, int]] = {}  # path -> (size, mtime_ns)

    def pull(self) -> None:
        """Starts the local working copy from what the run directory holds (a resumed run's
        metrics, events and W&B id); a local run directory needs nothing."""
        if not self.remote:
            return
        shutil.rmtree(self.local, ignore_errors=True)  # a stale copy of an earlier process
        self.local.mkdir(parents=True, exist_ok=True)
        for name in STREAMED:
            if name == "hf":  # exports are written once and never appended to
                continue
            remote = f"{self._base}/{name}"
            if self._fs.exists(remote):
                self._fs.get(remote, str(self.local / name), recursive=self._fs.isdir(remote))

    def push(self) -> None:
        """Uploads the working copy's files to the run directory (a no-op when local)."""
        if not self.remote or not self.local.is_dir():
            return
        for path in sorted(self.local.rglob("*")):
            if not path.is_file() or path.relative_to(self.local).parts[0] not in STREAMED:
                continue
            st = path.stat()
            if self._uploaded.get(path) == (st.st_size, st.st_mtime_ns):
                continue  # unchanged since its last upload
            target = f"{self._base}/{path.relative_to(self.local).as_posix()}"
            self._fs.put_file(str(path), target)
            self._uploaded[path] = (st.st_size, st.st_mtime_ns)

    def remote_path(self, local: pathlib.Path) -> os.PathLike:
        """Where a file of the working copy lands in the run directory."""
        if not self.remote:
            return local
        return self.run_dir / pathlib.Path(local).relative_to(self.local).as_posix()
