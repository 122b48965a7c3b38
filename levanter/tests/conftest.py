"""Shared test set-up: a persistent compilation cache, so identical programs compile once.

Under Bazel the cache is the run's shared one (.bazelrc's JAX_COMPILATION_CACHE_DIR, made private
by tools/python/test_env.py), else one under $TEST_TMPDIR (Bazel's per-test scratch directory);
run outside Bazel, in a fresh temporary directory removed at exit, so cached programs never
outlive the test run.
Subprocesses started by the tests (see _subprocess.py) inherit it through the environment.
"""

import atexit
import os
import shutil
import tempfile

import jax


def _cache_dir() -> str:
    if os.environ.get("TEST_TMPDIR"):
        shared = os.environ.get("JAX_COMPILATION_CACHE_DIR")
        return shared or os.path.join(os.environ["TEST_TMPDIR"], "jax_cache")
    path = tempfile.mkdtemp(prefix="meltemi-jax-cache-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir()
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
