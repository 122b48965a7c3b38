"""Every Bazel test runs with a home of its own (tools/python/test_env.py)."""

import os
import pathlib
import subprocess
import sys

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
