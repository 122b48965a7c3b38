"""Code that must pass given unit tests, run in a sandboxed subprocess.

The response's code (the first fenced block, else the whole response) followed by the task's
tests (plain `assert`s) is written to `main.py` in a fresh temporary directory and run by
`python -I` with:

- a wall-clock limit (`timeout_s`; the whole process group is killed) and a CPU-time limit;
- an address-space limit (`memory_mb`, `RLIMIT_AS`), an output-file limit and no core files;
- no network: a new user and network namespace (`unshare -rn`: only a loopback that is down)
  when the kernel allows it, else a guard that makes Python's sockets refuse to connect
  (weaker: C code or `_socket` can bypass it). `CodeEnv.network_isolation` says which;
- an empty environment and the temporary directory as working directory and home.

Exit status 0 scores 1.0, a failing test 0.0. A run that exceeds its time is a "timeout"
failure, one killed by a signal "crashed", one that raised `MemoryError` "memory".
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from meltemi.levanter.envs._base import Environment, Prompt, Score, split_indices

__all__ = ["CodeEnv", "SandboxResult", "extract_code", "namespace_available", "run_sandboxed"]

NETWORK_MODES = ("auto", "namespace", "guard")

# Runs inside the child before the program: limits first, then the socket guard, then main.py.
_BOOT = """\
import resource, runpy, sys
_mem, _cpu, _fsize, _guard = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if _guard == "1":
    import socket
    def _refuse(*args, **kwargs):
        raise OSError("network access is disabled in the sandbox")
    for _name in ("connect", "connect_ex", "sendto", "bind"):
        setattr(socket.socket, _name, _refuse)
    socket.create_connection = _refuse
    socket.getaddrinfo = _refuse
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_OUTPUT_LIMIT = 16 << 20
_TAIL = 4000


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did.

    Attributes:
        returncode: the exit status (negative: killed by that signal); None on a timeout.
        timed_out: the wall-clock limit was reached and the process group killed.
        stdout: the last 4000 characters of standard output.
        stderr: the last 4000 characters of standard error.
    """

    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str


@functools.cache
def namespace_available() -> bool:
    """Whether `unshare -rn` can make a user and network namespace here (probed once)."""
    path = shutil.which("unshare")
    if path is None:
        return False
    try:
        done = subprocess.run([path, "-rn", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def extract_code(response: str) -> str:
    """The first ```python (or bare ```) fenced block of `response`, else all of it."""
    match = _FENCE.search(response)
    return match.group(1) if match else response


def _tail(path: str) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - _TAIL))
        return f.read().decode("utf-8", "replace")


def run_sandboxed(
    source: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    network: str = "auto",
    python: str = sys.executable,
) -> SandboxResult:
    """Run Python `source` in a subprocess under the limits of the module docstring.

    Args:
        source: the program (`main.py`).
        timeout_s: wall-clock limit in seconds.
        memory_mb: address-space limit in MiB.
        network: "namespace" (`unshare -rn`; an error where it is unavailable), "guard"
            (Python-level socket guard) or "auto" (the namespace when available).
        python: the interpreter.
    """
    mode = _network_mode(network)
    with tempfile.TemporaryDirectory(prefix="meltemi-code-") as tmp:
        with open(os.path.join(tmp, "main.py"), "w", encoding="utf-8") as f:
            f.write(source)
        out_path, err_path = os.path.join(tmp, ".stdout"), os.path.join(tmp, ".stderr")
        argv = [
            python,
            "-I",
            "-c",
            _BOOT,
            str(memory_mb << 20),
            str(math.ceil(timeout_s) + 1),
            str(_OUTPUT_LIMIT),
            "1" if mode == "guard" else "0",
        ]
        if mode == "namespace":
            argv = [shutil.which("unshare") or "unshare", "-rn", *argv]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8"}
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                returncode: int | None = proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                returncode, timed_out = None, True
            finally:
                # The whole session: a forked child of the program must not outlive it.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        return SandboxResult(returncode, timed_out, _tail(out_path), _tail(err_path))


def _network_mode(network: str) -> str:
    if network not in NETWORK_MODES:
        raise ValueError(f"network={network!r}: use one of {NETWORK_MODES}, e.g. network='auto'")
    if network == "auto":
        return "namespace" if namespace_available() else "guard"
    if network == "namespace" and not namespace_available():
        raise ValueError(
            "network='namespace': `unshare -rn` is not available here (no unshare binary, or "
            "unprivileged user namespaces are disabled); use network='guard' or 'auto'"
        )
    return network


def _classify(result: SandboxResult) -> Score:
    if result.timed_out or result.returncode == -signal.SIGXCPU:
        return Score(0.0, "timeout")
    if result.returncode is not None and result.returncode < 0:
        return Score(0.0, "crashed")
    if result.returncode == 0:
        return Score(1.0)
    if "MemoryError" in result.stderr:
        return Score(0.0, "memory")
    return Score(0.0)


class CodeEnv(Environment):
    """Programming tasks graded by running their unit tests in `run_sandboxed`.

    Args:
        tasks: (description, tests) pairs; the tests are Python (`assert`s) run after the code.
        timeout_s: wall-clock limit of one run.
        memory_mb: address-space limit of one run.
        test_fraction: the held-out share of the tasks.
        split_seed: the shuffle that splits them.
        network: see `run_sandboxed`.
        name: the environment's name.
    """

    def __init__(
        self,
        tasks: Sequence[tuple[str, str]],
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        network: str = "auto",
        name: str = "code",
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r}: must be > 0, e.g. timeout_s=5.0")
        if memory_mb < 64:
            raise ValueError(
                f"memory_mb={memory_mb!r}: the interpreter alone needs more; use >= 64, "
                f"e.g. memory_mb=512"
            )
        self.name = name
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.network_isolation = _network_mode(network)
        self._tasks = [tuple(t) for t in tasks]
        self._splits = split_indices(len(self._tasks), test_fraction, split_seed)

    def size(self, split: str) -> int:
        self.check_split(split)
        return len(self._splits[split])

    def prompt(self, split: str, index: int) -> Prompt:
        self.check_split(split, index)
        description, tests = self._tasks[self._splits[split][index]]
        return Prompt(
            id=f"{self.name}/{split}/{index}", text=description, target=tests, env=self.name
        )

    def run(self, prompt: Prompt, response: str) -> SandboxResult:
        """The sandboxed run of `response`'s code followed by `prompt`'s tests."""
        source = extract_code(response) + "\n\n" + prompt.target + "\n"
        return run_sandboxed(
            source,
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            network=self.network_isolation,
        )

    def reward(self, prompt: Prompt, response: str) -> Score:
        return _classify(self.run(prompt, response))
