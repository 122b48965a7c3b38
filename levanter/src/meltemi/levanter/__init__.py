"""meltemi.levanter: the Meltemi trainer and its optimizers.

Subpackages:

- `meltemi.levanter.config`: Python config files, variants, overrides, provenance.
- `meltemi.levanter.trainer`: the jitted step, the loop, multislice, the dry run.
- `meltemi.levanter.checkpoint`: asynchronous, verified orbax checkpoints with retention.
- `meltemi.levanter.mesh`: the device mesh from `mesh.ici` / `mesh.dcn`.
- `meltemi.levanter.tracking`: metrics.jsonl, TensorBoard files, progress bar, loss curve.
- `meltemi.levanter.optim`: optimizers as optax transforms, schedules.

The binary: `bazel run //levanter:train -- --config=levanter/configs/default.py`.

>>> import meltemi.levanter
>>> meltemi.levanter.__version__
'0.1.0'
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
