"""The start-up hook `_meltemi_lm_eval`, each case in a fresh interpreter.

The module is imported the way its `.pth` line imports it, before anything else; lm-eval
comes from the interpreter's own environment. The registry is read through its public
`items()` (a lazy entry stays the "module:Name" string until lm-eval materialises it).
"""

import os
import pathlib
import subprocess
import sys

HOOK_DIR = pathlib.Path(__file__).absolute().parents[1] / "src"
TARGET = "meltemi.levanter.harness._model:MeltemiLM"
_READ = "from lm_eval.api.registry import model_registry; "
_READ += "print(dict(model_registry.items()).get('meltemi'))"


def _run(program: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(HOOK_DIR)}
    return subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_hook_imports_nothing_and_registers_when_lm_eval_loads_its_models():
    proc = _run(
        "import sys, _meltemi_lm_eval; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lm_eval', 'jax', 'meltemi'})); "
        "import lm_eval.models; " + _READ
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", TARGET]
    assert proc.stderr == ""


def test_without_the_hook_lm_eval_has_no_meltemi_model():
    proc = _run("import lm_eval.models; " + _READ)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["None"]


def test_the_hook_registers_at_once_when_lm_eval_is_already_loaded():
    proc = _run("import lm_eval.models, _meltemi_lm_eval; " + _READ)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [TARGET]


def test_a_refusing_registry_is_one_line_and_lm_evals_own_models_still_run():
    proc = _run(
        "import lm_eval.models; from lm_eval.api.registry import model_registry; "
        "model_registry.freeze(); import _meltemi_lm_eval; "
        "print('meltemi' in model_registry, 'hf' in model_registry)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["False True"]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("meltemi-lm-eval: could not register lm-eval model 'meltemi' (")
    assert line.endswith("run `python -m meltemi.levanter.harness ...` instead of `lm_eval ...`")
