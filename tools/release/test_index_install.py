"""The way users will get Meltemi from a package index: one library alone, by name.

The six wheels are built and published into a local PEP 503 "simple" index directory. Then
`meltemi-fray` alone, `meltemi-models` alone, and `meltemi-levanter[harness]` followed by the
opt-in `meltemi-lm-eval` are installed by name with `pip install --index-url file://...` into
fresh virtualenvs; pip must find the Meltemi libraries each depends on in that index (and only
there). Third-party dependencies are the
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
    for lib in wl.WHEELS:
        src = wl.copy_library(here / lib, work / "src" / lib)
        rl.publish(wl.build(src, work / "dist", sdist=False), simple)
    assert sorted(p.name for p in simple.iterdir() if p.is_dir()) == sorted(
        f"meltemi-{lib}" for lib in wl.WHEELS
    )
    return simple


def _env(venv_root: pathlib.Path, lib: str) -> pathlib.Path:
    """A fresh virtualenv holding the third-party requirements of `lib` and its Meltemi deps."""
    requirements = wl.meltemi_closure(pathlib.Path.cwd(), lib)[1]
    return wl.make_env(venv_root, [], wl.closure(requirements))


def _install(index: pathlib.Path, venv_root: pathlib.Path, lib: str, python=None) -> pathlib.Path:
    python = python or _env(venv_root, lib)
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


def test_models_alone_pulls_haliax_and_data_from_the_index(index, tmp_path):
    python = _install(index, tmp_path / "venv", "models")
    # meltemi-data (chat templates of meltemi.models.chat and the server) brings meltemi-fray.
    assert _installed(python) == {
        "meltemi-models",
        "meltemi-haliax",
        "meltemi-data",
        "meltemi-fray",
    }
    out = _run(python, MODELS_PROGRAM)
    assert "models says" in out and "True" in out


LM_EVAL_PROBE = """
import sys
print(sorted({m.split(".")[0] for m in sys.modules} & {"jax", "lm_eval", "meltemi"}))
import lm_eval.models
from lm_eval.api.registry import model_registry
print(dict(model_registry.items()).get("meltemi"))
if "meltemi" in model_registry:
    print(model_registry.get("meltemi").__name__)
"""


def test_lm_eval_model_is_opt_in_through_the_hook_wheel(index, tmp_path):
    python = _env(tmp_path / "venv", "lm-eval")  # lm-eval and the rest of the harness extra
    _install(index, tmp_path / "venv", "levanter[harness]", python)
    assert _installed(python) == {f"meltemi-{lib}" for lib in wl.LIBRARIES}
    (site,) = (tmp_path / "venv").glob("lib/python*/site-packages")
    assert not [p.name for p in site.glob("*.pth") if "meltemi" in p.name]
    assert _run(python, LM_EVAL_PROBE).splitlines() == ["[]", "None"]

    _install(index, tmp_path / "venv", "lm-eval", python)
    assert _installed(python) == {f"meltemi-{lib}" for lib in wl.WHEELS}
    target = "meltemi.levanter.harness._model:MeltemiLM"
    assert _run(python, LM_EVAL_PROBE).splitlines() == ["[]", target, "MeltemiLM"]
