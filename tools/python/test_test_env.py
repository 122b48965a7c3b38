"""Every Bazel test runs with a home of its own (tools/python/test_env.py)."""

import os
import pathlib
import subprocess
import sys
import time

import pytest

from tools.python import test_env

UNDER_BAZEL = "TEST_TMPDIR" in os.environ
bazel_only = pytest.mark.skipif(not UNDER_BAZEL, reason="needs the Bazel test environment")


def test_isolate_home_points_every_cache_into_the_test_dir():
    env = {"TEST_TMPDIR": "/scratch/t", "HOME": "/root", "XDG_CACHE_HOME": "/root/.cache"}
    assert test_env.isolate_home(env) == "/scratch/t/home"
    for name, _ in test_env._HOME_DIRS:
        assert env[name].startswith("/scratch/t/home/"), name
    assert env["HOME"] == "/scratch/t/home"


def test_isolate_home_leaves_a_plain_shell_alone():
    env = {"HOME": "/root"}
    assert test_env.isolate_home(env) is None
    assert env == {"HOME": "/root"}


def test_isolate_home_keeps_an_explicit_offline_choice():
    env = {"TEST_TMPDIR": "/t", "WANDB_MODE": "disabled"}
    test_env.isolate_home(env)
    assert env["WANDB_MODE"] == "disabled"
    assert env["HF_HUB_OFFLINE"] == "1"


@bazel_only
def test_home_is_the_tests_own_and_starts_empty():
    home = pathlib.Path(os.environ["TEST_TMPDIR"]) / "home"
    assert pathlib.Path.home() == home
    assert os.path.expanduser("~") == str(home)
    # Nothing a used machine would have, not even ~/.cache.
    assert not (home / ".ray").exists()
    assert not (home / ".cache").exists()


@bazel_only
def test_tools_that_cache_under_home_write_into_the_test_dir():
    tmp = os.environ["TEST_TMPDIR"]
    code = (
        "import matplotlib, huggingface_hub.constants as c, pathlib, os;"
        "print(matplotlib.get_configdir()); print(c.HF_HUB_CACHE); print(pathlib.Path.home())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for line in out.stdout.split():
        assert line.startswith(tmp), line


def test_private_compile_cache_creates_a_private_folder_and_caches_every_program(tmp_path):
    cache = tmp_path / "jax-cache"
    env = {"TEST_TMPDIR": str(tmp_path), "JAX_COMPILATION_CACHE_DIR": str(cache)}
    assert test_env.private_compile_cache(env) == str(cache)
    assert cache.stat().st_mode & 0o777 == 0o700
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "0"


def test_private_compile_cache_refuses_a_folder_others_can_write(tmp_path, capsys):
    cache = tmp_path / "jax-cache"
    cache.mkdir()
    cache.chmod(0o777)
    env = {"TEST_TMPDIR": str(tmp_path), "JAX_COMPILATION_CACHE_DIR": str(cache)}
    assert test_env.private_compile_cache(env) is None
    assert "JAX_COMPILATION_CACHE_DIR" not in env
    assert "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in env
    err = capsys.readouterr().err
    assert f"JAX_COMPILATION_CACHE_DIR={cache} is owned by uid" in err
    assert "with mode 0o777: tests run without the shared compilation cache" in err
    assert f"make it yours and private (`chmod 700 {cache}`)" in err


def test_private_compile_cache_leaves_a_plain_shell_alone(tmp_path):
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "c")}
    assert test_env.private_compile_cache(env) is None
    assert env == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "c")}
    assert not (tmp_path / "c").exists()


@bazel_only
def test_test_processes_share_one_private_compilation_cache():
    cache = pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    assert not cache.is_relative_to(os.environ["TEST_TMPDIR"])  # one for the whole run
    assert cache.stat().st_uid == os.getuid() and not cache.stat().st_mode & 0o022
    # A program compiled in well under JAX's default 1 s threshold lands in the cache (a
    # constant of this run's own: a new program even on a machine with a warm cache).
    before = set(os.listdir(cache))
    scale = time.time_ns()
    code = f"import jax, jax.numpy as jnp; print(jax.jit(lambda x: x * {scale}.0)(jnp.ones(3)))"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    assert set(os.listdir(cache)) - before
