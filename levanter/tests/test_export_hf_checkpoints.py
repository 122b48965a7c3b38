"""`checkpoint.export_hf`: a Hugging Face checkpoint beside every checkpoint."""

import _subprocess
import pytest
import safetensors.numpy

from meltemi.levanter.config import InertKeyError, base_config, resolve, with_variant


def _tensors(directory):
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(safetensors.numpy.load_file(str(path)))
    return out


def test_every_checkpoint_is_also_exported_and_the_last_equals_the_final_export(tmp_path):
    proc = _subprocess.run(
        tmp_path / "run",
        tmp_path / "cache",
        "--config.eval.num_batches=0",
        "--config.checkpoint.export_hf=true",
        f"--export_hf={tmp_path / 'final'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf = tmp_path / "run" / "hf"
    assert sorted(p.name for p in hf.iterdir()) == ["step_00000001", "step_00000002"]
    for step in hf.iterdir():
        assert (step / "config.json").exists()
    last, first, final = (_tensors(hf / "step_00000002"), _tensors(hf / "step_00000001"),
                          _tensors(tmp_path / "final"))  # fmt: skip
    assert last and last.keys() == final.keys() == first.keys()
    assert all((last[k] == final[k]).all() for k in last)  # step 2 is the final state
    assert any((last[k] != first[k]).any() for k in last)  # step 1's weights are earlier ones


def test_export_hf_without_checkpoints_is_inert():
    config = with_variant(base_config(), None, {})
    config.checkpoint.enabled = False
    config.checkpoint.export_hf = True
    with pytest.raises(InertKeyError, match=r"checkpoint.export_hf=True has no effect while"):
        resolve(config)
