"""The step-boundary hooks the binaries add to the trainer, from the config.

The trainer runs evaluation and checkpoints itself; everything else a config asks for at step
boundaries is wired here, so the trainer needs no edit for a new one (`Trainer(hooks=...)`).
"""

from __future__ import annotations

from meltemi.levanter.config import ConfigError, RunSpec
from meltemi.levanter.trainer import Hook


def training_hooks(spec: RunSpec) -> list[Hook]:
    """The hooks `spec` asks for: lm-evaluation-harness tasks (`eval.harness_tasks`).

    A module-level function, so a multislice slice or a sweep worker can be handed it (it is
    pickled by reference) and build the hooks in its own process.

    Raises:
        ConfigError: harness tasks without lm-eval installed, naming the extra to install.
        EvalError: a task lm-eval does not know (checked here, before the first step).
    """
    if not spec.eval.harness_tasks:
        return []
    try:
        # lm-eval is the optional `harness` extra: imported only when tasks are configured.
        from meltemi.levanter import harness  # noqa: PLC0415
    except ImportError as e:
        raise ConfigError(
            f"eval.harness_tasks={spec.eval.harness_tasks!r} needs lm-eval ({e}); "
            f"install the harness extra: pip install 'meltemi-levanter[harness]'."
        ) from None
    return [harness.HarnessHook(spec)]
