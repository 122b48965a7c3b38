"""`resolve` builds the whole optimizer chain as a check, without any device work."""

import subprocess
import sys
import textwrap

import pytest

from meltemi.levanter.config import ConfigError, base_config, resolve, with_variant
from meltemi.levanter.optim import step_schedule

_CHECK = textwrap.dedent(
    """
    from jax._src import xla_bridge
    from meltemi.levanter import optim
    from meltemi.levanter.config import base_config, resolve, with_variant
    built = []
    real = optim.build_optimizer
    optim.build_optimizer = lambda *a, **k: built.append(real(*a, **k)) or built[-1]
    config = with_variant(base_config(), None, {})
    for key, value in OVERRIDES.items():
        section, name = key.split(".")
        config[section][name] = value
    resolve(config)
    print("chains built:", len(built))
    print("backend started:", xla_bridge.backends_are_initialized())
    """
)


@pytest.mark.parametrize(
    "overrides",
    [
        {"optimizer.max_grad_norm": ((0, 1.0), (50, 0.2))},
        {
            "optimizer.name": "muon",
            "optimizer.adam_learning_rate": 3e-4,
            "optimizer.update_clip_window": 8,
            "optimizer.skip_step_window": 8,
            "optimizer.ema_beta": 0.99,
        },
    ],
    ids=["grad_norm_schedule", "muon_clip_skip_ema"],
)
def test_resolve_builds_the_chain_without_starting_the_backend(overrides):
    code = f"OVERRIDES = {overrides!r}\n" + _CHECK
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "chains built: 1" in proc.stdout, proc.stdout
    assert "backend started: False" in proc.stdout, proc.stdout


def test_step_schedule_holds_no_jax_array_until_called():
    schedule = step_schedule([(0, 1.0), (5, 0.2)])
    constants = [c.cell_contents for c in schedule.__closure__]
    assert constants and not any(type(c).__module__.startswith("jax") for c in constants)
    assert [round(float(schedule(s)), 3) for s in (0, 4, 5, 99)] == [1.0, 1.0, 0.2, 0.2]


def test_a_chain_error_is_a_config_error_at_resolve():
    config = with_variant(base_config(), None, {})
    config.optimizer.name = "muon"  # its AdamW fallback needs adam_learning_rate
    with pytest.raises(ConfigError, match=r"optimizer\.adam_learning_rate=None"):
        resolve(config)
