"""Each preset's analytic and `jax.eval_shape` parameter counts equal Hugging Face's."""

import hf_harness
import pytest

from meltemi.models import get_preset, list_presets, param_count


@pytest.mark.parametrize("name", list_presets())
def test_analytic_param_count_matches_hugging_face(name):
    cfg = get_preset(name)
    assert param_count(cfg) == hf_harness.hf_param_count(cfg)
