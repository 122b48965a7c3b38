"""The way users will get Meltemi from a package index: one library alone, by name.

The five wheels are built and published into a local PEP 503 "simple" index directory. Then
`meltemi-fray` alone, and `meltemi-models` alone, are installed by name with
`pip install --index-url file://...` into fresh virtualenvs; pip must find the Meltemi
libraries each depends on in that index (and only there). Third-party dependencies are the
lock's own installed copies, linked into the virtualenv, so nothing is downloaded.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tools.release import release_lib as rl
from tools.wheels import wheel_lib as wl

FRAY_PROGRAM = """
from meltemi import fray

class Doubler:
    def twice(self, x):
        return 2 * x

with fray.InProcessCluster() as cluster:
    print("fray says", cluster.spawn(Doubler).twice(21))
"""

MODELS_PROGRAM = """
import jax, jax.numpy as jnp
import meltemi.models as mm
import meltemi.haliax as hax

config = mm.get_preset("tiny-llama")
model = mm.init(config, key=jax.random.PRNGKey(0))
tokens = jnp.arange(8, dtype=jnp.int32)[None, :] % config.vocab_size
logits = model(tokens)
print("models says", tuple(a.name for a in logits.axes), bool(jnp.isfinite(logits.array).all()))
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    here = pathlib.Path.cwd()
    work = tmp_path_factory.mktemp("release")
    simple = work / "simple"
    for lib in wl.LIBRARIES:
        src = wl.copy_library(here / lib, work / "src" / lib)
        rl.publish(wl.build(src, work / "dist", sdist=False), simple)
    assert sorted(p.name for p in simple.iterdir() if p.is_dir()) == sorted(
        f"meltemi-{lib}" for lib in wl.LIBRARIES
    )
    return simple


def _install(index: pathlib.Path, venv_root: pathlib.Path, lib: str) -> pathlib.Path:
    here = pathlib.Path.cwd()
    requirements = []
    for name in [lib, *wl.split_requirements(wl.read_pyproject(here / lib)["project"])[0]]:
        requirements += wl.split_requirements(wl.read_pyproject(here / name)["project"])[1]
    python = wl.make_env(venv_root, [], wl.closure(requirements))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python),
         "install", "--no-cache-dir", "--index-url", index.as_uri(), f"meltemi-{lib}"],
        capture_output=True,
        text=True,
        # No pip configuration at all (this machine's has extra indexes): only `index` is used.
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
             "PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


def _run(python: pathlib.Path, program: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [str(python), "-I", "-c", program], capture_output=True, text=True, env=env, cwd="/"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _installed(python: pathlib.Path) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split("==")[0].lower() for line in out.splitlines() if line.startswith("meltemi")}


def test_fray_alone_from_the_index(index, tmp_path):
    python = _install(index, tmp_path / "venv", "fray")
    assert _installed(python) == {"meltemi-fray"}
    assert "fray says 42" in _run(python, FRAY_PROGRAM)


def test_models_alone_pulls_haliax_from_the_index(index, tmp_path):
    python = _install(index, tmp_path / "venv", "models")
    assert _installed(python) == {"meltemi-models", "meltemi-haliax"}
    out = _run(python, MODELS_PROGRAM)
    assert "models says" in out and "True" in out
