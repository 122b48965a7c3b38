"""Config files, variants, command-line overrides and provenance."""

import json
import pathlib
import textwrap

import pytest

from meltemi.levanter import config as cfg

CONFIG_FILE = textwrap.dedent(
    """
    from meltemi.levanter.config import base_config, with_variant

    VARIANTS = {"short": {"trainer.num_train_steps": 7, "data.seq_len": 17}}

    def get_config(variant=None):
        config = base_config()
        config.name = "probe"
        config.trainer.num_train_steps = 13
        return with_variant(config, variant, VARIANTS)
    """
)


@pytest.fixture
def config_file(tmp_path: pathlib.Path) -> str:
    path = tmp_path / "probe.py"
    path.write_text(CONFIG_FILE)
    return str(path)


def test_variant_overrides_the_files_base(config_file):
    resolved = cfg.load_config(config_file + ":short")
    assert resolved.config.trainer.num_train_steps == 7
    assert resolved.config.data.seq_len == 17
    assert resolved.config.name == "probe"


def test_loaded_config_is_locked(config_file):
    resolved = cfg.load_config(config_file)
    with pytest.raises(AttributeError):
        resolved.config.trainer.new_key = 1


def test_override_sets_value_with_field_type(config_file):
    resolved = cfg.load_config(
        config_file, [("optimizer.learning_rate", "3"), ("trainer.seed", "5")]
    )
    assert resolved.config.optimizer.learning_rate == 3.0
    assert isinstance(resolved.config.optimizer.learning_rate, float)
    assert resolved.config.trainer.seed == 5


def test_provenance_names_default_file_variant_and_flag(config_file):
    resolved = cfg.load_config(config_file + ":short", [("trainer.seed", "5")])
    p = resolved.provenance
    assert p["checkpoint.save_every_steps"] == "default"
    assert p["name"] == "file"
    assert p["trainer.num_train_steps"] == "variant"
    assert p["trainer.seed"] == "flag"


def test_print_format_shows_value_and_provenance(config_file):
    text = cfg.load_config(config_file, [("trainer.seed", "5")]).format()
    line = next(ln for ln in text.splitlines() if ln.startswith("trainer.seed "))
    assert "= 5" in line and line.endswith("# flag")


def test_unknown_key_suggests_closest(config_file):
    with pytest.raises(
        cfg.UnknownConfigKeyError, match=r"Did you mean `--config.trainer.num_train_steps`"
    ):
        cfg.load_config(config_file, [("trainer.num_train_step", "3")])


def test_unknown_key_missing_section_prefix_suggests_full_key(config_file):
    with pytest.raises(cfg.UnknownConfigKeyError, match=r"Did you mean `--config.trainer.seed`"):
        cfg.load_config(config_file, [("seed", "3")])


def test_wrong_type_names_field_value_and_type(config_file):
    with pytest.raises(
        cfg.ConfigTypeError, match=r"'abc' is not a valid int, the type of `trainer.seed`"
    ):
        cfg.load_config(config_file, [("trainer.seed", "abc")])


def test_float_text_for_int_field_is_rejected(config_file):
    with pytest.raises(cfg.ConfigTypeError, match=r"trainer.num_train_steps=1.5"):
        cfg.load_config(config_file, [("trainer.num_train_steps", "1.5")])


def test_section_override_is_rejected_with_its_fields(config_file):
    with pytest.raises(cfg.ConfigError, match=r"`--config.mesh.ici` is a section.*mesh.ici.fsdp"):
        cfg.load_config(config_file, [("mesh.ici", "4")])


def test_unknown_variant_suggests_closest(config_file):
    with pytest.raises(cfg.ConfigError, match=r"unknown variant `:shrt`. Did you mean `:short`"):
        cfg.load_config(config_file + ":shrt")


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(cfg.ConfigError, match=r"does not exist"):
        cfg.load_config(str(tmp_path / "nope.py"))


def test_unlocked_get_config_is_rejected(tmp_path):
    path = tmp_path / "unlocked.py"
    path.write_text(
        "from meltemi.levanter.config import base_config\n"
        "def get_config():\n    return base_config()\n"
    )
    with pytest.raises(cfg.ConfigError, match=r"unlocked ConfigDict"):
        cfg.load_config(str(path))


def test_parse_override_args_reads_both_flag_forms():
    argv = [
        "prog",
        "--config=x.py",
        "--config.trainer.seed=3",
        "--config.data.seq_len",
        "9",
        "--other",
    ]
    assert cfg.parse_override_args(argv) == [("trainer.seed", "3"), ("data.seq_len", "9")]


def test_bool_override_parses_words(config_file):
    resolved = cfg.load_config(config_file, [("trainer.progress_bar", "no")])
    assert resolved.config.trainer.progress_bar is False


def test_json_round_trip_keeps_values_and_provenance(config_file):
    resolved = cfg.load_config(config_file + ":short", [("trainer.seed", "5")])
    again = cfg.ResolvedConfig.from_json(resolved.to_json())
    assert again.config.to_dict() == resolved.config.to_dict()
    assert again.provenance == resolved.provenance
    assert json.loads(resolved.to_json())["overrides"] == ["trainer.seed=5"]


def test_union_field_keeps_int_steps_and_float_fractions(config_file):
    steps = cfg.load_config(config_file, [("optimizer.warmup", "100")]).config
    fraction = cfg.load_config(config_file, [("optimizer.warmup", "0.1")]).config
    assert steps.optimizer.warmup == 100 and isinstance(steps.optimizer.warmup, int)
    assert fraction.optimizer.warmup == 0.1


def test_preset_placeholder_takes_typed_value(config_file):
    resolved = cfg.load_config(config_file, [("model.num_layers", "3")])
    assert resolved.config.model.num_layers == 3
    with pytest.raises(cfg.ConfigTypeError, match=r"not a valid int"):
        cfg.load_config(config_file, [("model.num_layers", "three")])


def test_optional_field_accepts_a_literal(config_file):
    resolved = cfg.load_config(config_file, [("optimizer.max_grad_norm", "((0, 1.0), (50, 0.2))")])
    assert resolved.config.optimizer.max_grad_norm == ((0, 1.0), (50, 0.2))
