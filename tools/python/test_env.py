"""One place that keeps every test away from the real home directory.

Under `bazel test` the home directory is read-only inside the sandbox, and on a fresh machine it
holds none of the caches a developer's machine has (`~/.ray`, `~/.cache/huggingface`, a warm
JAX compilation cache, matplotlib's font cache). A test that writes there fails only on a
newcomer's machine, or passes only because of a file left behind earlier. Every Bazel test entry
point (`pytest_main.py`, `doctest_main.py`, `check_wheel.py`) calls `isolate_home()` first, so
each test gets an empty home of its own under `TEST_TMPDIR` and every tool that caches under
home writes there instead. Subprocesses inherit it through the environment.

Outside Bazel (no `TEST_TMPDIR`) nothing changes: a developer running pytest by hand keeps
their own environment.
"""

from __future__ import annotations

import os
import sys

# Tools that cache or write under home, each pointed at a folder of the test's own home.
# (variable, path relative to the new home)
_HOME_DIRS: tuple[tuple[str, str], ...] = (
    ("XDG_CACHE_HOME", ".cache"),
    ("XDG_CONFIG_HOME", ".config"),
    ("XDG_DATA_HOME", ".local/share"),
    ("XDG_STATE_HOME", ".local/state"),
    ("MPLCONFIGDIR", ".config/matplotlib"),  # matplotlib's font cache
    ("HF_HOME", ".cache/huggingface"),  # huggingface_hub, transformers, datasets
    ("WANDB_DIR", "wandb"),
    ("WANDB_CACHE_DIR", ".cache/wandb"),
    ("WANDB_CONFIG_DIR", ".config/wandb"),
    ("WANDB_DATA_DIR", ".local/share/wandb"),
    ("PIP_CACHE_DIR", ".cache/pip"),
    ("FRAY_ROOT", ".fray"),  # fray's secrets and logs (default: a fixed folder under /tmp)
    ("IPYTHONDIR", ".ipython"),
    ("JUPYTER_CONFIG_DIR", ".jupyter"),
)

# Set so nothing reaches for the network at run time (the tests build what they need).
_OFFLINE: tuple[tuple[str, str], ...] = (
    ("HF_HUB_OFFLINE", "1"),
    ("HF_DATASETS_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("WANDB_MODE", "offline"),
    ("PIP_NO_INPUT", "1"),
    ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
)


# XLA:CPU spends most of a small test program's compile time in its MLIR fusion emitters and
# LLVM's optimisation passes, and tests check values, not speed: under a test runner every
# program compiles with the classic fusion emitters, at -O0, without the expensive LLVM passes.
# Measured on the smoke train step (5,412 HLO lines) in one process at load ~15: 22.3 s by
# default, 11.1 s at -O0, 2.7 s with all three; models/tests/test_model.py 45 s -> 19 s.
# The flags change float rounding (a few 1e-7 relative), so every process of a test must
# compile the same way: subprocesses inherit XLA_FLAGS, and tests that add flags (fake devices)
# append to it. `MELTEMI_TEST_FULL_OPT=1` turns this off.
FAST_COMPILE_FLAGS: tuple[str, ...] = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)


def compile_fast(environ: dict | None = None) -> bool:
    """Adds `FAST_COMPILE_FLAGS` to XLA_FLAGS under a test runner (`TEST_TMPDIR` set).

    Returns whether the flags are in effect.

    >>> env = {"TEST_TMPDIR": "/tmp/t", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    >>> compile_fast(env), env["XLA_FLAGS"].split()[0]
    (True, '--xla_force_host_platform_device_count=8')
    >>> compile_fast({"TEST_TMPDIR": "/tmp/t", "MELTEMI_TEST_FULL_OPT": "1"})
    False
    """
    env = os.environ if environ is None else environ
    if not env.get("TEST_TMPDIR") or env.get("MELTEMI_TEST_FULL_OPT") == "1":
        return False
    flags = env.get("XLA_FLAGS", "").split()
    flags += [f for f in FAST_COMPILE_FLAGS if f not in flags]
    env["XLA_FLAGS"] = " ".join(flags)
    return True


# JAX's persistent compilation cache, shared by every test process of one `bazel test` run
# (.bazelrc sets JAX_COMPILATION_CACHE_DIR): targets compile the same tiny models, trainer steps
# and optimizers, so a program compiled by one target is read by the next. The key covers the
# program, XLA_FLAGS (fake device counts, `FAST_COMPILE_FLAGS`), devices and JAX version.
# Every program is cached (JAX's defaults skip those compiled in under 1 s: most test programs).
_CACHE_ENV: tuple[tuple[str, str], ...] = (
    ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"),
    ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0"),
)


def private_compile_cache(environ: dict | None = None) -> str | None:
    """Makes the run's JAX_COMPILATION_CACHE_DIR a private folder, or drops it.

    Under a test runner (`TEST_TMPDIR` set) with JAX_COMPILATION_CACHE_DIR set, creates the
    folder (mode 0700) and checks that it is this user's and not group- or world-writable: JAX
    runs the executables it reads from there. A folder that fails the check is not used (the
    tests compile instead) and a warning names it and the fix.

    Args:
        environ: the environment to change (default: `os.environ`).

    Returns:
        The cache folder in use, or None.
    """
    env = os.environ if environ is None else environ
    path = env.get("JAX_COMPILATION_CACHE_DIR")
    if not env.get("TEST_TMPDIR") or not path:
        return None
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        problem = f"cannot be created ({e})"
    else:
        if st.st_uid == os.getuid() and not st.st_mode & 0o022:
            for name, value in _CACHE_ENV:
                env.setdefault(name, value)
            return path
        problem = f"is owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)}"
    del env["JAX_COMPILATION_CACHE_DIR"]
    print(
        f"warning: JAX_COMPILATION_CACHE_DIR={path} {problem}: tests run without the shared "
        f"compilation cache; make it yours and private (`chmod 700 {path}`) or remove it",
        file=sys.stderr,
    )
    return None


def isolate_home(environ: dict | None = None) -> str | None:
    """Points HOME and every known per-user cache at a fresh folder under `TEST_TMPDIR`.

    Args:
        environ: the environment to change (default: `os.environ`).

    Returns:
        The new home directory, or None when not under a test runner (no `TEST_TMPDIR`).

    >>> env = {"TEST_TMPDIR": "/tmp/t", "HOME": "/root"}
    >>> isolate_home(env)
    '/tmp/t/home'
    >>> env["HOME"], env["XDG_CACHE_HOME"], env["HF_HUB_OFFLINE"]
    ('/tmp/t/home', '/tmp/t/home/.cache', '1')
    """
    env = os.environ if environ is None else environ
    tmp = env.get("TEST_TMPDIR")
    if not tmp:
        return None
    home = os.path.join(tmp, "home")
    env["HOME"] = home
    env["USERPROFILE"] = home
    for name, rel in _HOME_DIRS:
        env[name] = os.path.join(home, rel)
    for name, value in _OFFLINE:
        env.setdefault(name, value)
    if environ is None:
        # Only the home itself: a fresh machine has no ~/.cache either, and each tool must
        # create the folders it needs.
        os.makedirs(home, mode=0o700, exist_ok=True)
    return home
