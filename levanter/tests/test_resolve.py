"""`resolve(config) -> RunSpec`: every check once, before any work, as one ConfigError type."""

import dataclasses
import pathlib

import pytest

from meltemi import data as md
from meltemi.levanter.config import (
    BatchScheduleError,
    ConfigError,
    InertKeyError,
    MixtureConfigError,
    RunSpec,
    UnknownConfigKeyError,
    load_config,
    resolve,
)
from meltemi.levanter.optim import OptimizerConfig
from meltemi.levanter.trainer import build_parts

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
SMOKE = f"{CONFIGS / 'default.py'}:smoke"


def _resolve(*overrides, spec=SMOKE):
    return resolve(load_config(spec, list(overrides)))


def test_every_error_kind_is_a_config_error():
    for kind in (BatchScheduleError, MixtureConfigError, InertKeyError, UnknownConfigKeyError):
        assert issubclass(kind, ConfigError)


def test_sections_are_frozen_and_typed():
    spec = _resolve()
    assert isinstance(spec, RunSpec)
    assert isinstance(spec.optimizer, OptimizerConfig)
    assert spec.optimizer.total_steps == spec.trainer.num_train_steps == 2
    assert spec.model.hidden_dim == 32 and spec.model.vocab_size == 259
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.trainer.seed = 3


def test_the_optimizer_section_has_every_optimizer_config_field():
    spec = _resolve()
    fields = {f.name for f in dataclasses.fields(OptimizerConfig)} - {"total_steps"}
    assert fields <= set(spec.resolved.config.optimizer.keys())


def test_bf16_names_the_dtype_spelling():
    with pytest.raises(
        ConfigError,
        match=r"trainer.compute_dtype='bf16': write the dtype's name, "
        r"--config.trainer.compute_dtype=bfloat16",
    ):
        _resolve(("trainer.compute_dtype", "bf16"))


def test_float16_is_refused_for_want_of_loss_scaling():
    with pytest.raises(
        ConfigError, match=r"trainer.compute_dtype='float16': float16 needs loss scaling"
    ):
        _resolve(("trainer.compute_dtype", "float16"))


def test_a_misspelt_preset_suggests_the_right_one():
    with pytest.raises(
        ConfigError, match=r"model.preset='tiny-lama': unknown model preset.*'tiny-llama'"
    ):
        _resolve(("model.preset", "tiny-lama"))


def test_a_model_field_error_names_the_model_key():
    with pytest.raises(ConfigError, match=r"^model.num_layers=0: must be a positive int"):
        _resolve(("model.num_layers", "0"))


def test_a_string_where_a_tuple_of_patterns_is_expected_is_refused():
    # A plain string would be iterated character by character: every parameter decayed.
    with pytest.raises(
        ConfigError,
        match=r"optimizer.no_decay_patterns='norm' is a string.*"
        r"--config.optimizer.no_decay_patterns=\"\('norm',\)\"",
    ):
        _resolve(("optimizer.no_decay_patterns", "norm"))


def test_a_string_where_a_tuple_of_files_is_expected_is_refused():
    with pytest.raises(
        ConfigError, match=r"data.train_files='x.txt' is a string.*\"\('x.txt',\)\""
    ):
        _resolve(("data.source", "files"), ("data.train_files", "x.txt"))


def test_train_files_are_inert_with_the_stdlib_source():
    with pytest.raises(
        InertKeyError, match=r"data.train_files=\('x.txt',\) has no effect with data.source="
    ):
        _resolve(("data.train_files", "('x.txt',)"))


def test_an_optimizer_error_names_the_optimizer_key():
    with pytest.raises(ConfigError, match=r"^optimizer.name='adamx' is not one of"):
        _resolve(("optimizer.name", "adamx"))


def test_the_schedule_is_checked_at_resolve():
    with pytest.raises(ConfigError, match=r"^optimizer.warmup=2.0 is a float"):
        _resolve(("optimizer.warmup", "2.0"))


def test_a_mesh_with_two_fill_axes_is_refused_before_any_device_is_used():
    with pytest.raises(ConfigError, match=r"mesh.ici: \['data', 'fsdp'\] are all -1"):
        _resolve(("mesh.ici.fsdp", "-1"))


def test_dcn_sizes_must_match_the_number_of_slices():
    with pytest.raises(ConfigError, match=r"mesh.dcn: sizes .* multiply to 1, but mesh.num_slices"):
        _resolve(("mesh.num_slices", "2"), ("mesh.dcn.data", "1"))


def test_microbatches_must_divide_every_batch_size():
    with pytest.raises(
        ConfigError, match=r"trainer.microbatches=3 does not divide the batch size 4"
    ):
        _resolve(("trainer.microbatches", "3"))


def test_bos_token_is_inert_with_the_byte_tokenizer():
    with pytest.raises(
        InertKeyError, match=r"data.bos_token='<s>' has no effect with data.tokenizer='byte'"
    ):
        _resolve(("data.bos_token", "<s>"))


def test_an_unknown_verify_mode_suggests_the_closest():
    with pytest.raises(
        ConfigError, match=r"checkpoint.verify='checksum'.*--config.checkpoint.verify=checksums"
    ):
        _resolve(("checkpoint.verify", "checksum"))


def test_verify_sha256_is_the_former_name_of_checksums():
    assert _resolve(("checkpoint.verify", "sha256")).checkpoint.verify == "checksums"


def test_resolve_builds_no_store(tmp_path):
    spec = _resolve(
        ("data.cache_dir", str(tmp_path / "cache")), spec=f"{CONFIGS / 'mixture.py'}:smoke"
    )
    assert spec.data.mixture.names == ["stdlib", "tests"]
    assert isinstance(spec.tokenizer, md.ByteTokenizer)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            (("optimizer.adam_learning_rate", "1e-3"),),
            r"^optimizer.adam_learning_rate=0.001 has no "
            r"effect with name='adamw'",
        ),
        ((("optimizer.muon_beta", "0.9"),), r"^optimizer.muon_beta=0.9 has no effect with name="),
        (
            (("optimizer.skip_step_sigma", "3.0"),),
            r"^optimizer.skip_step_sigma=3.0 has no effect "
            r"while skip_step_window=None",
        ),
        ((("optimizer.skip_step_warmup", "10"),), r"^optimizer.skip_step_warmup=10 has no effect"),
        (
            (("optimizer.update_clip_sigma", "3.0"),),
            r"^optimizer.update_clip_sigma=3.0 has no "
            r"effect while update_clip_window=None",
        ),
        (
            (("optimizer.rewarmup", "10"),),
            r"^optimizer.rewarmup=10 has no effect while "
            r"cycles=None",
        ),
        (
            (("optimizer.adamc", "decay"), ("optimizer.lr_schedule", "constant")),
            r"^optimizer.adamc='decay' has no effect with lr_schedule='constant'",
        ),
    ],
    ids=["adam_lr", "muon_beta", "skip_sigma", "skip_warmup", "clip_sigma", "rewarmup", "adamc"],
)
def test_an_inert_optimizer_key_names_the_key_and_the_setting(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _resolve(*overrides)


def test_a_gs_run_dir_without_gcsfs_names_the_package_not_a_local_directory(monkeypatch):
    import fsspec

    def missing(protocol):
        raise ImportError("Please install gcsfs to access Google Storage")

    monkeypatch.setattr(fsspec, "get_filesystem_class", missing)
    with pytest.raises(ConfigError, match=r"run_dir='gs://bucket/run': gs:// needs the gcsfs"):
        _resolve(("run_dir", "gs://bucket/run"))


def test_an_s3_run_dir_is_refused_naming_why():
    with pytest.raises(ConfigError, match=r"run_dir='s3://bucket/run': only gs:// object"):
        _resolve(("run_dir", "s3://bucket/run"))


def test_train_files_matching_nothing_name_the_key_before_any_store(tmp_path):
    spec = _resolve(
        ("data.source", "files"),
        ("data.train_files", repr((str(tmp_path / "none" / "*.txt"),))),
        ("data.cache_dir", str(tmp_path / "cache")),
    )
    with pytest.raises(ConfigError, match=r"^data.train_files: .*no files match"):
        build_parts(spec)
    assert not (tmp_path / "cache").exists()
