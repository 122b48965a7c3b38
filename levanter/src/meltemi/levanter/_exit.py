"""The binaries' exit statuses, and which one an error ends a command with.

A scheduler reads the status to decide what to do next:

    status  name        meaning                                         what to do
    0       DONE        the command finished                            nothing
    1       FAILED      a bug (a traceback); isoflop: runs failed       read the traceback
    2       USAGE       a mistake in the flags or the config            fix the command
    74      IO_ERROR    a read or write failed (disk full, a directory  fix the storage, then
                        that cannot be written); sysexits' EX_IOERR     run the same command
    75      PREEMPTED   SIGTERM stopped the run after saving, or fewer  run the same command
                        than mesh.min_slices slices; EX_TEMPFAIL        again (it resumes)

Statuses 2 and 74 print one `error: ...` line on stderr, never a traceback.

Example:
    >>> import errno
    >>> exit_status(OSError(errno.ENOSPC, "No space left on device"))
    74
    >>> exit_status(ConfigError("trainer.seed=-1: must be >= 0"))
    2
    >>> exit_status(KeyError("a bug")) == FAILED
    True
"""

from __future__ import annotations

from meltemi import data as md
from meltemi import fray
from meltemi.levanter.checkpoint import CheckpointError
from meltemi.levanter.config import ConfigError

DONE = 0
FAILED = 1
USAGE = 2
IO_ERROR = 74
PREEMPTED = 75

# Where `mark` records an error's status: an attribute survives pickling (a slice process
# sends its error to the launcher), where the `__cause__` chain it is computed from does not.
_ATTRIBUTE = "meltemi_exit_status"


def io_cause(error: BaseException) -> OSError | None:
    """The `OSError` that `error` is or was raised from (its cause or context chain), if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def exit_status(error: BaseException) -> int:
    """The status a command that ended with `error` exits with (`FAILED` for a bug).

    A config or usage mistake is `USAGE`; a failed read or write (an `OSError`, or a checkpoint
    error raised from one) is `IO_ERROR`; a checkpoint that cannot be used as asked, or a data
    store or source that cannot be opened, is `USAGE`. An error that crossed a process (fray's
    `RemoteError`) is judged by the remote error, or by the status `mark` recorded on it.
    """
    recorded = getattr(error, _ATTRIBUTE, None)
    if isinstance(recorded, int):
        return recorded
    if isinstance(error, fray.RemoteError):
        return FAILED if error.cause is None else exit_status(error.cause)
    if isinstance(error, ConfigError):
        return USAGE
    if isinstance(error, OSError):
        return IO_ERROR
    if isinstance(error, CheckpointError):
        return IO_ERROR if io_cause(error) is not None else USAGE
    if isinstance(error, (md.StoreError, md.SourceError)):
        return USAGE
    return FAILED


def mark(error: BaseException) -> BaseException:
    """Records `exit_status(error)` on `error` itself, so that it survives pickling."""
    try:
        setattr(error, _ATTRIBUTE, exit_status(error))
    except AttributeError:  # an exception type with __slots__: judged again where it lands
        pass
    return error


def error_line(error: BaseException, run_dir: object = None) -> str:
    """The one line (without `error: `) a binary prints for a usage or I/O `error`.

    An I/O failure says so, names the file (when the error knows it) and the run directory,
    and how to go on; other errors are their message's first line.
    """
    if isinstance(error, fray.RemoteError) and error.cause is not None:
        error = error.cause
    text = _first_line(error)
    if exit_status(error) != IO_ERROR:
        return text
    where = f" (run_dir {run_dir})" if run_dir and str(run_dir) not in str(error) else ""
    if isinstance(error, OSError):
        return (
            f"I/O failure: {_os_error(error)}{where}; free space or make the directory "
            f"writable, then run the same command again (exit status {IO_ERROR})"
        )
    cause = io_cause(error)  # the wrapping error's message says what failed and the fix
    if cause is not None and cause.filename and str(cause.filename) not in text:
        text += f" [{_os_error(cause)}]"
    return f"I/O failure{where}: {text} (exit status {IO_ERROR}: run the same command again)"


def _os_error(error: OSError) -> str:
    text = error.strerror or _first_line(error)
    if error.errno is not None:
        text = f"[Errno {error.errno}] {text}"
    if error.filename:
        text += f": {error.filename}"
    return text


def _first_line(error: BaseException) -> str:
    message = error.message if isinstance(error, fray.RemoteError) else str(error)
    lines = str(message).strip().splitlines()
    return lines[0] if lines else type(error).__name__
