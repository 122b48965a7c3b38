"""meltemi.levanter: the Meltemi trainer and its optimizers.

Subpackages, bottom up (a floor imports only the floors below it; `tests/test_layers.py`):

- `meltemi.levanter.optim`: optimizers as optax transforms, schedules, preference losses.
- `meltemi.levanter.envs`: RL environments with verifiable rewards (no JAX).
- `meltemi.levanter.mesh`: the device mesh from `mesh.ici` / `mesh.dcn`.
- `meltemi.levanter.checkpoint`: asynchronous, verified orbax checkpoints with retention.
- `meltemi.levanter.config`: Python config files, variants, overrides, provenance.
- `meltemi.levanter.tracking`: metrics.jsonl, TensorBoard files, progress bar, loss curve.
- `meltemi.levanter.runtime`: compute context, shardings, dtypes, global batches.
- `meltemi.levanter.evaluation`: eval sets, bits per byte, loading checkpoints.
- `meltemi.levanter.trainer`: the jitted step, the loop and its hooks, the dry run.
- `meltemi.levanter.harness`: lm-evaluation-harness on Meltemi models (a trainer hook too).
- `meltemi.levanter.multislice`: elastic multislice jobs and their status file.
- `meltemi.levanter.rl`: GRPO/RLOO, on-policy distillation, rollout workers on fray.
- `meltemi.levanter.experiments`: isoflop sweeps and scaling-law fits.
- `meltemi.levanter.dashboard`: the run dashboard (the `dashboard` extra).
- `meltemi.levanter.main`: the binaries.

The binary: `bazel run //levanter:train -- --config=levanter/configs/default.py`.

>>> import meltemi.levanter
>>> meltemi.levanter.__version__
'0.1.0'
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
