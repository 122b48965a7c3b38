"""The binaries' shared command-line parsing (`meltemi.levanter.main._flags`), in process."""

import pathlib

import pytest
from _one_error import one_error_line
from absl import flags

from meltemi.levanter.main import _flags

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"


def _flag_values() -> flags.FlagValues:
    values = flags.FlagValues()
    flags.DEFINE_string("config", None, "config", flag_values=values)
    flags.DEFINE_bool("verify", False, "verify", flag_values=values)
    return values


def test_loads_config_with_overrides_relative_to_the_users_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the config path is taken relative to BUILD_WORKING_DIRECTORY
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(CONFIGS.parent))
    state: dict = {}
    rest = _flags.parse(
        ["prog", "--config", "configs/default.py:smoke", "--config.trainer.seed=11", "--verify"],
        state,
        example="levanter/configs/default.py",
        keep_overrides=False,
        flag_values=(values := _flag_values()),
    )
    assert rest == ["prog"]
    assert state["config"].config.trainer.seed == 11
    assert values.verify is True
    assert values.config == str(CONFIGS / "default.py") + ":smoke"  # made absolute


def test_missing_config_names_an_example(capsys):
    with pytest.raises(SystemExit) as exit_:
        _flags.parse(
            ["prog"], {}, example="levanter/configs/isoflop.py", flag_values=_flag_values()
        )
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err
        == "error: pass a config, e.g. --config=levanter/configs/isoflop.py\n"
    )


def test_config_is_optional_without_an_example():
    state: dict = {}
    assert _flags.parse(["prog", "--verify"], state, flag_values=_flag_values()) == ["prog"]
    assert "config" not in state


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--config.trainer.no_such_field=1"], "no_such_field"),
        (["--config.trainer.seed=abc"], "trainer.seed"),
        (["--no_such_flag=1"], "no_such_flag"),
    ],
)
def test_mistakes_are_one_error_line_and_status_2(argv, expected, capsys):
    config = str(CONFIGS / "default.py") + ":smoke"
    with pytest.raises(SystemExit) as exit_:
        _flags.parse(
            ["prog", f"--config={config}", *argv],
            {},
            keep_overrides=False,
            flag_values=_flag_values(),
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in one_error_line(err)


def test_user_path_is_relative_to_the_users_directory(monkeypatch):
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", "/home/me/work")
    assert _flags.user_path("runs/a") == "/home/me/work/runs/a"
    assert _flags.user_path("/abs/b") == "/abs/b"
    assert _flags.user_path("") == ""
