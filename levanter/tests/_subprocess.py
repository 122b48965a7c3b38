"""Running the trainer binary in a subprocess (as `bazel run //levanter:train` would)."""

import os
import pathlib
import subprocess
import sys

TRAIN = pathlib.Path(__file__).parent.parent / "src" / "meltemi" / "levanter" / "main" / "train.py"
DEFAULT = pathlib.Path(__file__).parent.parent / "configs" / "default.py"


def env() -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out.setdefault("JAX_PLATFORMS", "cpu")
    # The test's fake-device flag must not leak into the binary (one device, as a user runs it);
    # its other flags (tools/python/test_env.py: how programs compile) must, so that the
    # subprocess's numbers are bit for bit those of the test process.
    flags = [
        f
        for f in out.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    out["XLA_FLAGS"] = " ".join(flags)
    # Share compiled programs between the test's subprocesses (same program, same binary),
    # in the cache conftest.py set up, or under $TEST_TMPDIR: never a directory that outlives
    # the test run.
    if not out.get("JAX_COMPILATION_CACHE_DIR") and os.environ.get("TEST_TMPDIR"):
        out["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.environ["TEST_TMPDIR"], "jax_cache")
    if out.get("JAX_COMPILATION_CACHE_DIR"):
        out.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        out.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    return out


def command(run_dir, cache_dir, *overrides, variant="smoke"):
    return [
        sys.executable,
        str(TRAIN),
        f"--config={DEFAULT}:{variant}",
        f"--config.run_dir={run_dir}",
        f"--config.data.cache_dir={cache_dir}",
        *overrides,
    ]


def run(run_dir, cache_dir, *overrides, variant="smoke", timeout=600, cwd=None):
    return subprocess.run(
        command(run_dir, cache_dir, *overrides, variant=variant),
        env=env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(run_dir, cache_dir, *overrides, variant="smoke"):
    return subprocess.Popen(
        command(run_dir, cache_dir, *overrides, variant=variant),
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
