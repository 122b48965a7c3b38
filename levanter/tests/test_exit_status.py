"""Exit statuses: 2 for a mistake in a config file's own code (one line naming file:line), 74
for an I/O failure during training (one line naming the path), for one process and for a
multislice launcher whose slice failed."""

import errno
import pathlib
import pickle
import subprocess
import sys

import _subprocess
import pytest
from _one_error import one_error_line
from absl import flags

from meltemi import fray
from meltemi.levanter import _exit
from meltemi.levanter.checkpoint import CheckpointError
from meltemi.levanter.config import ConfigError, load_config, resolve
from meltemi.levanter.main import _flags
from meltemi.levanter.multislice import _launch
from meltemi.levanter.trainer import _trainer

MAIN = _subprocess.TRAIN.parent
ENOSPC = OSError(errno.ENOSPC, "No space left on device")

# -- an exception in a config file's code: one `error: file:line: ...` line, status 2 ---------

HEADER = "from meltemi.levanter.config import base_config, with_variant\n\n"
GET_CONFIG = (
    "def get_config(variant=None):\n"
    "    config = base_config()\n"
    "    return with_variant(config, variant, {})\n"
)
# name -> (the file, the text of the line the error is on, what the message says)
BROKEN = {
    "syntax_error": (
        HEADER + "def get_config(variant=None):\n    config = base_config(\n"
        "    return with_variant(config, variant, {})\n",
        "    config = base_config(",
        "SyntaxError: '(' was never closed (while loading the file)",
    ),
    "name_error": (
        HEADER + "STEPS = num_steps * 2\n\n" + GET_CONFIG,
        "STEPS = num_steps * 2",
        "NameError: name 'num_steps' is not defined (while loading the file)",
    ),
    "in_get_config": (
        HEADER + "def get_config(variant=None):\n    config = base_config()\n"
        "    config.trainer.num_train_steps = int('ten')\n"
        "    return with_variant(config, variant, {})\n",
        "    config.trainer.num_train_steps = int('ten')",
        "ValueError: invalid literal for int() with base 10: 'ten' (in get_config())",
    ),
    "in_a_helper_of_get_config": (
        HEADER + "def _sizes():\n    return {'a': 1}['b']\n\n"
        "def get_config(variant=None):\n    config = base_config()\n"
        "    config.model.hidden_dim = _sizes()\n"
        "    return with_variant(config, variant, {})\n",
        "    return {'a': 1}['b']",
        "KeyError: 'b' (in get_config())",
    ),
}


def _broken(tmp_path, name) -> tuple[pathlib.Path, str]:
    """The broken config file and the `path:line: message` its error line must hold."""
    text, line, message = BROKEN[name]
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    number = text.splitlines().index(line) + 1
    return path, f"{path}:{number}: {message}"


@pytest.mark.parametrize("name", list(BROKEN))
def test_an_exception_in_a_config_files_code_is_one_line_naming_its_line(tmp_path, name, capsys):
    path, expected = _broken(tmp_path, name)
    values = flags.FlagValues()
    flags.DEFINE_string("config", None, "config", flag_values=values)
    with pytest.raises(SystemExit) as exit_:
        _flags.parse(["prog", f"--config={path}"], {}, keep_overrides=False, flag_values=values)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert one_error_line(err) == f"error: {expected}; fix the config file there."
    assert err.count("\n") == 1


def test_the_error_names_the_variant_get_config_was_called_with(tmp_path):
    path = tmp_path / "variants.py"
    path.write_text(
        HEADER + "def get_config(variant=None):\n    config = base_config()\n"
        "    config.trainer.seed = {None: 0}[variant]\n"
        "    return with_variant(config, variant, {'smoke': {}})\n"
    )
    message = rf"^{path}:5: KeyError: 'smoke' \(in get_config\('smoke'\)\); fix the config"
    with pytest.raises(ConfigError, match=message):
        load_config(f"{path}:smoke")


def test_a_config_error_raised_in_get_config_is_kept_as_it_is(tmp_path):
    path = tmp_path / "variant.py"
    path.write_text(HEADER + GET_CONFIG)
    with pytest.raises(ConfigError, match=r"^unknown variant `:smok`") as info:
        load_config(f"{path}:smok")
    assert str(path) not in str(info.value)


@pytest.mark.parametrize("binary", ["train", "eval", "isoflop"])
def test_every_binary_taking_a_config_prints_one_line_and_exits_2(tmp_path, binary):
    path, expected = _broken(tmp_path, "name_error")
    proc = subprocess.run(
        [sys.executable, str(MAIN / f"{binary}.py"), f"--config={path}"],
        env=_subprocess.env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert one_error_line(proc.stderr).startswith(f"error: {expected}")


@pytest.mark.parametrize("binary", ["train", "isoflop"])
def test_help_shows_the_exit_statuses_without_a_config(binary):
    proc = subprocess.run(
        [sys.executable, str(MAIN / f"{binary}.py"), "--help"],
        env=_subprocess.env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "74" in proc.stdout and "I/O failure" in proc.stdout, proc.stdout + proc.stderr


# -- I/O failures during training: one `error: I/O failure ...` line, status 74 ---------------

# The trainer binary with every metrics.jsonl write failing as on a full disk (ENOSPC, which a
# buffered write reports without a file name).
_FULL_DISK = """
import errno, os, runpy, sys
from meltemi.levanter.tracking import _jsonl
def write(self, record):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
_jsonl.MetricsWriter.write = write
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_full_disk_during_training_exits_74_naming_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    command = _subprocess.command(run_dir, tmp_path / "cache", "--config.eval.num_batches=0")
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, *command[1:]],
        env=_subprocess.env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == _exit.IO_ERROR == 74, proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    expected = f"error: I/O failure: [Errno 28] No space left on device (run_dir {run_dir}); "
    assert line.startswith(expected), line


def test_an_unwritable_run_dir_exits_74_naming_it(tmp_path):
    # A file where a directory must go (root may write into any directory, whatever its mode).
    (tmp_path / "file").write_text("not a directory")
    run_dir = tmp_path / "file" / "run"
    proc = _subprocess.run(run_dir, tmp_path / "cache", "--config.eval.num_batches=0")
    assert proc.returncode == 74, proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    assert line.startswith("error: I/O failure: [Errno 20] Not a directory: "), line
    assert str(run_dir) in line


# -- which status an error ends a command with ------------------------------------------------


def _raised(error: BaseException, cause: BaseException | None) -> BaseException:
    try:
        raise error from cause
    except BaseException as e:
        return e


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("trainer.seed=-1"), 2),
        (_raised(ConfigError("--config.run_dir=x: cannot read"), ENOSPC), 2),
        (ENOSPC, 74),
        (PermissionError(errno.EACCES, "Permission denied", "/runs/a"), 74),
        (_raised(CheckpointError("saving the checkpoint of step 4 failed"), ENOSPC), 74),
        (CheckpointError("no checkpoint under /runs/a"), 2),
        (KeyError("a bug"), 1),
    ],
    ids=["config", "config_from_oserror", "enospc", "eacces", "save", "restore", "bug"],
)
def test_exit_status_of_each_kind_of_error(error, status):
    assert _exit.exit_status(error) == status


def test_a_marked_error_keeps_its_status_through_pickling():
    error = _raised(CheckpointError("saving the checkpoint of step 4 failed"), ENOSPC)
    # Pickling drops the chain the status is read from ...
    assert _exit.exit_status(pickle.loads(pickle.dumps(error))) == 2
    # ... and keeps what `mark` recorded.
    assert _exit.exit_status(pickle.loads(pickle.dumps(_exit.mark(error)))) == 74


class _FullDisk:
    """A `Trainer` whose run fails as a checkpoint save on a full disk does."""

    def __init__(self, *args, **kwargs):
        pass

    def run(self, **kwargs):
        raise CheckpointError("saving the checkpoint of step 4 failed") from OSError(
            errno.ENOSPC, "No space left on device"
        )


class _Bug(_FullDisk):
    def run(self, **kwargs):
        raise KeyError("a bug")


def test_train_marks_its_error_for_the_multislice_launcher(monkeypatch):
    monkeypatch.setattr(_trainer, "Trainer", _FullDisk)
    with pytest.raises(CheckpointError) as info:
        _trainer.train(None)
    assert _exit.exit_status(pickle.loads(pickle.dumps(info.value))) == 74


class _Slice:
    """A slice actor: trains with `train`, as `SliceWorker.run` does."""

    def run(self):
        return _trainer.train(None)


@pytest.fixture
def job(tmp_path):
    resolved = load_config(
        f"{_subprocess.DEFAULT}:multislice",
        [("run_dir", str(tmp_path / "run")), ("data.cache_dir", str(tmp_path / "cache"))],
    )
    (tmp_path / "run").mkdir()
    with fray.InProcessCluster() as cluster:
        yield _launch._ElasticJob(resolve(resolved), cluster, 0, None, 0.0, False), cluster


def _remote_error(cluster, monkeypatch, trainer) -> fray.RemoteError:
    monkeypatch.setattr(_trainer, "Trainer", trainer)
    with pytest.raises(fray.RemoteError) as info:
        cluster.spawn(_Slice, name="slice-0").run.remote().result()
    return info.value  # its cause travelled pickled, as between processes


def test_a_slices_io_failure_is_the_launchers_status_74(job, monkeypatch, capsys):
    job, cluster = job
    status, _ = job._fail([0, 1], 0, _remote_error(cluster, monkeypatch, _FullDisk))
    assert status == 74
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: slice 0: I/O failure (run_dir "), line


def test_a_slices_bug_stays_status_1_with_its_traceback(job, monkeypatch, capsys):
    job, cluster = job
    status, why = job._fail([0, 1], 0, _remote_error(cluster, monkeypatch, _Bug))
    assert status == 1
    assert "remote traceback" in why and "error: " not in capsys.readouterr().err
