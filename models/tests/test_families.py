"""The table of model families (`meltemi.models._families`): one record per family, read
everywhere, and agreeing with transformers' own config classes."""

from __future__ import annotations

import ast
import pathlib
import typing

import pytest
import transformers

import meltemi.models as mm
from meltemi.models import _families
from meltemi.models._families import FAMILIES, FAMILY_FACTS, Family

transformers.logging.set_verbosity_error()

PACKAGE = pathlib.Path(mm.__file__).parent


def _preset_of(family: str) -> mm.ModelConfig:
    """The tiny preset of `family` (every family has one)."""
    names = [p for p in mm.list_presets() if p.startswith("tiny-")]
    found = [mm.get_preset(p) for p in names if mm.get_preset(p).family == family]
    assert found, f"no tiny-* preset of family {family!r}"
    return found[0]


def _with_window(config: mm.ModelConfig) -> mm.ModelConfig:
    """`config` with a window on its sliding layers (its own one if it has one)."""
    return config if config.sliding_window else config.replace(sliding_window=3)


def _transformers_config(d: dict) -> transformers.PretrainedConfig:
    d = dict(d)
    return transformers.CONFIG_MAPPING[d.pop("model_type")](**d)


# -- no family name outside the table ----------------------------------------------------------
def _is_family(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name == "family"


def _is_names(node: ast.AST) -> bool:
    """A string literal, or a tuple / list / set of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_names(e) for e in node.elts)
    return False


def family_checks(source: str) -> list[int]:
    """Lines of `source` that branch on the family by name: `family == "gpt2"`,
    `family in ("gemma", ...)`, or a literal dict keyed by family names."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_family(s) for s in sides) and any(_is_names(s) for s in sides):
                lines.append(node.lineno)
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if sum(k in FAMILIES for k in keys) >= 2:
                lines.append(node.lineno)
    return lines


def test_the_scan_finds_each_kind_of_family_check():
    source = (
        'a = config.family == "gpt2"\n'
        'b = family in ("gemma", "gemma2")\n'
        'c = "olmo2" != self.family\n'
        'd = {"gemma2": 2, "gemma3_text": 6}.get(family)\n'
        'e = config.facts.moe == "mixtral"\n'  # a fact's value, not a family check
        "f = family == other\n"
    )
    assert family_checks(source) == [1, 2, 3, 4]


def test_no_module_outside_the_table_compares_family_to_a_name():
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_families.py" and (lines := family_checks(path.read_text()))
    }
    assert found == {}, f"read the family's record (ModelConfig.facts) instead: {found}"


def test_the_family_literal_lists_the_table():
    assert typing.get_args(Family) == FAMILIES == tuple(FAMILY_FACTS)
    assert mm.FAMILIES == FAMILIES


# -- the table agrees with transformers ----------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_model_type_and_architecture_name_one_transformers_class(family):
    facts = FAMILY_FACTS[family]
    arch = getattr(transformers, facts.hf_architecture)
    assert arch.config_class.model_type == facts.hf_model_type


@pytest.mark.parametrize("family", FAMILIES)
def test_defaults_and_config_keys_are_those_of_the_transformers_config(family):
    facts = FAMILY_FACTS[family]
    theirs = transformers.CONFIG_MAPPING[facts.hf_model_type]()
    eps = getattr(theirs, "rms_norm_eps", None) or theirs.layer_norm_epsilon
    assert (facts.default_norm_eps, facts.default_tie_embeddings) == (
        eps,
        theirs.tie_word_embeddings,
    )
    assert hasattr(theirs, "sliding_window") == (facts.hf_window_keys is not None)
    assert hasattr(theirs, "use_sliding_window") == (facts.hf_window_keys == "qwen")
    assert hasattr(theirs, "query_pre_attn_scalar") == (facts.hf_window_keys == "gemma")
    assert hasattr(theirs, "attention_bias") == facts.hf_attention_bias_key
    assert hasattr(theirs, "mlp_bias") == facts.hf_mlp_bias_key


# -- every family round-trips through config.json ----------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_round_trips_through_the_hf_config(family):
    config = _preset_of(family)
    d = mm.to_hf_config(config)
    assert (d["model_type"], d["architectures"]) == (
        FAMILY_FACTS[family].hf_model_type,
        [FAMILY_FACTS[family].hf_architecture],
    )
    assert mm.from_hf_config(d) == config
    # ... and through transformers' own reading of it.
    assert mm.from_hf_config(_transformers_config(d).to_dict()) == config


@pytest.mark.parametrize("family", FAMILIES)
def test_a_window_is_accepted_exactly_where_the_table_says_and_survives_config_json(family):
    config = _preset_of(family)
    if not FAMILY_FACTS[family].sliding_window:
        with pytest.raises(mm.ConfigError, match=r"sliding_window=3: family .* has no sliding"):
            config.replace(sliding_window=3)
        return
    config = _with_window(config)
    d = mm.to_hf_config(config)
    assert mm.from_hf_config(d) == config
    theirs = _transformers_config(d)
    assert theirs.sliding_window == config.sliding_window
    types = getattr(theirs, "layer_types", None) or ["sliding_attention"] * config.num_layers
    assert tuple(t == "sliding_attention" for t in types) == config.sliding_layers


def test_qwen2_without_layer_types_slides_from_transformers_default_max_window_layers():
    # A Qwen2 config.json without `layer_types` nor `max_window_layers`: transformers slides
    # the layers from its default max_window_layers (28) on, not every layer.
    d = _transformers_config(mm.to_hf_config(_with_window(_preset_of("qwen2")))).to_dict()
    d.update(num_hidden_layers=30)
    del d["layer_types"], d["max_window_layers"]
    theirs = _transformers_config(d).layer_types
    assert theirs.count("sliding_attention") == 2  # the case the test is about
    ours = mm.from_hf_config(d)
    assert tuple(t == "sliding_attention" for t in theirs) == ours.sliding_layers


def test_sliding_window_refusal_names_the_families_of_the_table():
    d = mm.to_hf_config(_preset_of("qwen3")) | {"use_sliding_window": True, "sliding_window": 4}
    names = ("gemma2", "gemma3_text", "mistral", "qwen2")
    assert _families.families_with(sliding_window=True) == names
    with pytest.raises(mm.HfConfigError, match=f"supported for {', '.join(names)}, not qwen3"):
        mm.from_hf_config(d)
