"""One definition per config key: a section field gives base_config, the reference and the check.

Every key field of every section class (`config._sections.SECTIONS`) must appear in
`base_config()` with its default and in the README's key reference, and its check must refuse
the key's `wrong` value with one line naming the key. A key added to a section (simulated below
with a new `eval.harness_*` field) gets all of that, and the inert-key rule, from that one field.
"""

import dataclasses
import pathlib

import ml_collections
import pytest

from meltemi.levanter import config as cfg
from meltemi.levanter.config import _base, _eval_spec
from meltemi.levanter.config._checks import AtLeast
from meltemi.levanter.config._keys import key, keys_of
from meltemi.levanter.config._sections import SECTIONS

_README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_BEGIN, _END = "<!-- config-keys:begin -->", "<!-- config-keys:end -->"
_DERIVED = ("model", "optimizer")  # sections derived from ModelConfig / OptimizerConfig


def _keys() -> list[tuple[str, object]]:
    """`(dotted key, Key)` of every key field of every section class."""
    return [
        (f"{name}.{field}" if name else field, k)
        for name, cls in SECTIONS
        if dataclasses.is_dataclass(cls)
        for field, k in keys_of(cls)
    ]


def _at(config: ml_collections.ConfigDict, dotted: str):
    for part in dotted.split("."):
        config = config[part]
    return config


def _with(dotted: str, value) -> ml_collections.ConfigDict:
    """base_config() as a plain ConfigDict (no field types) with `dotted` set to `value`."""
    tree = cfg.base_config().to_dict()
    node = tree
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    return ml_collections.ConfigDict(tree)


def test_every_section_key_is_in_base_config_with_its_default():
    config = cfg.base_config()
    for dotted, k in _keys():
        value = _at(config, dotted)
        if isinstance(value, ml_collections.ConfigDict):
            value = value.to_dict()
        assert value == k.default, dotted


def test_base_config_has_no_key_without_a_definition():
    defined = {d for d, k in _keys() if not isinstance(k.default, dict)}
    sub_sections = {d for d, k in _keys() if isinstance(k.default, dict)}
    leaves = {
        k
        for k in cfg.flatten(cfg.base_config())
        if k.split(".")[0] not in _DERIVED and k.rsplit(".", 1)[0] not in sub_sections
    }
    assert leaves == defined


def test_the_readme_key_reference_is_the_generated_one():
    text = _README.read_text()
    assert _BEGIN in text and _END in text, f"{_README} has no {_BEGIN} ... {_END} block"
    committed = text.split(_BEGIN, 1)[1].split(_END, 1)[0].strip("\n") + "\n"
    assert committed == cfg.key_reference(), (
        "the README's key reference is out of date; regenerate it with "
        "`python -c 'from meltemi.levanter.config import key_reference; print(key_reference())'`"
    )


def test_the_reference_lists_every_key_with_its_help():
    reference = cfg.key_reference()
    for dotted, k in _keys():
        suffix = ".*" if isinstance(k.default, dict) else ""
        row = next(r for r in reference.splitlines() if r.startswith(f"| `{dotted}{suffix}` |"))
        assert k.help.replace("|", "\\|") in row


def test_the_default_config_resolves_through_a_plain_config_dict():
    # The wrong-value test below builds its configs this way; the defaults must pass.
    assert cfg.resolve(_with("name", "run")).trainer.num_train_steps == 1000


@pytest.mark.parametrize("dotted", [d for d, _ in _keys()])
def test_every_key_refuses_its_wrong_value_in_one_line_naming_it(dotted):
    k = dict(_keys())[dotted]
    with pytest.raises(cfg.ConfigError) as error:
        cfg.resolve(_with(dotted, k.check.wrong))
    message = str(error.value)
    assert "\n" not in message
    assert dotted in message, message


@dataclasses.dataclass(frozen=True, kw_only=True)
class _EvalWithNewKey(cfg.EvalSpec):
    """EvalSpec with one more key: the one edit that adds `eval.harness_batch_size`."""

    harness_batch_size: int = key(1, "Requests per harness batch.", AtLeast(1, example=4))


@pytest.fixture
def new_key(monkeypatch):
    sections = tuple((n, _EvalWithNewKey if n == "eval" else c) for n, c in SECTIONS)
    monkeypatch.setattr(_base, "SECTIONS", sections)
    monkeypatch.setattr(_eval_spec, "EvalSpec", _EvalWithNewKey)


def test_a_key_added_as_one_field_is_in_base_config_and_the_reference(new_key):
    assert cfg.base_config().eval.harness_batch_size == 1
    assert "| `eval.harness_batch_size` | `1` | Requests per harness batch. |" in (
        cfg.key_reference()
    )


def test_a_key_added_as_one_field_is_parsed_checked_and_resolved(new_key, tmp_path):
    path = tmp_path / "c.py"
    path.write_text(
        "from meltemi.levanter.config import base_config, with_variant\n\n"
        "def get_config(variant=None):\n"
        "    return with_variant(base_config(), variant, {})\n"
    )
    tasks = ("eval.harness_tasks", "('t',)"), ("eval.harness_every_steps", "5")
    resolved = cfg.load_config(str(path), [*tasks, ("eval.harness_batch_size", "4")])
    assert resolved.provenance["eval.harness_batch_size"] == "flag"
    assert cfg.resolve(resolved).eval.harness_batch_size == 4
    with pytest.raises(cfg.ConfigError, match=r"^eval.harness_batch_size=0: must be an int >= 1"):
        cfg.resolve(cfg.load_config(str(path), [*tasks, ("eval.harness_batch_size", "0")]))
    with pytest.raises(
        cfg.InertKeyError, match=r"^eval.harness_batch_size=4 has no effect without eval.harness"
    ):
        cfg.resolve(cfg.load_config(str(path), [("eval.harness_batch_size", "4")]))
