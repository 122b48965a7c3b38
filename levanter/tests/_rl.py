"""Shared set-up of the RL loop tests: the SFT stage of rl_arithmetic.py, and an RL spec."""

import pathlib

from meltemi.levanter.config import load_config, resolve, rl_spec
from meltemi.levanter.trainer import train

CONFIG = pathlib.Path(__file__).parent.parent / "configs" / "rl_arithmetic.py"


def sft(run_dir: pathlib.Path, steps: int | None = None) -> pathlib.Path:
    """Runs `rl_arithmetic.py:sft` (the answer format) into `run_dir`; returns it."""
    overrides = [("run_dir", str(run_dir)), ("trainer.progress_bar", "False")]
    if steps is not None:
        overrides.append(("trainer.num_train_steps", str(steps)))
    train(resolve(load_config(f"{CONFIG}:sft", overrides)))
    return run_dir


def rl_specs(run_dir: pathlib.Path, **overrides):
    """`(spec, rl)` of rl_arithmetic.py with `key=value` overrides (dots as `__`)."""
    pairs = [("run_dir", str(run_dir))]
    pairs += [(k.replace("__", "."), str(v)) for k, v in overrides.items()]
    resolved = load_config(str(CONFIG), pairs)
    return resolve(resolved), rl_spec(resolved.config)
