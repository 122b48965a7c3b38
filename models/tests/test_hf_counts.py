"""Each preset's parameter count under `jax.eval_shape` equals the one Hugging Face reports.

HF models are built on torch's meta device, so even marin-32b costs no memory.
"""

import equinox as eqx
import hf_harness
import jax
import pytest

import meltemi.models as mm


@pytest.mark.parametrize("name", mm.list_presets())
def test_eval_shape_param_count_matches_hugging_face(name):
    cfg = mm.get_preset(name)
    shapes = eqx.filter_eval_shape(mm.Transformer.init, cfg, key=jax.random.key(0))
    hf_count = hf_harness.hf_param_count(name)
    assert shapes.param_count == hf_count
    assert mm.param_count(cfg) == hf_count


def test_marin_sizes_are_what_the_names_say():
    assert round(mm.param_count(mm.get_preset("marin-8b")) / 1e9, 2) == 8.03
    assert round(mm.param_count(mm.get_preset("marin-32b")) / 1e9, 2) == 32.52
    qk_extra = mm.param_count(mm.get_preset("marin-32b-qk")) - mm.param_count(
        mm.get_preset("marin-32b")
    )
    assert qk_extra == 64 * 2 * 128  # one q and one k norm of head_size 128 per layer
