"""Ray's private token cache, which `RayCluster` resets, is exactly as tested on the pinned
Ray, and a changed one falls back to Ray's own caching with one warning.

`ray._raylet.AuthenticationTokenLoader` is the only way to make Ray forget the token of a
process's first `ray.init` (a second RayCluster gets a new token and must not present the old
one). No Ray is started here: the loader reads token files without one.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import ray

from meltemi.fray import ray as fray_ray

_TOKEN_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test sees a process that has not warned yet and no token settings of the user."""
    monkeypatch.setattr(fray_ray, "_warned_loader", threading.Event())
    for var in _TOKEN_VARS:
        monkeypatch.delenv(var, raising=False)


def _token_file(tmp_path, name: str) -> str:
    path = tmp_path / name
    path.write_text(name * 64)
    return str(path)


def test_the_pinned_ray_has_the_token_cache_reset():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fray_ray.token_loader() is ray._raylet.AuthenticationTokenLoader


def test_reloading_makes_ray_read_the_new_token_file(tmp_path, monkeypatch):
    loader = ray._raylet.AuthenticationTokenLoader.instance()
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", _token_file(tmp_path, "a"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fray_ray._reload_token()
        assert loader.get_raw_token(ignore_auth_mode=True) == "a" * 64
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", _token_file(tmp_path, "b"))
        assert loader.get_raw_token(ignore_auth_mode=True) == "a" * 64  # Ray's cache
        fray_ray._reload_token()
        assert loader.get_raw_token(ignore_auth_mode=True) == "b" * 64
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    fray_ray._reload_token()  # later tests must not inherit this cached token


class _ChangedLoader:
    """A loader whose `reset_cache` grew a parameter: it must not be called."""

    resets = 0

    @classmethod
    def instance(cls) -> _ChangedLoader:
        return cls()

    def reset_cache(self, everything: bool) -> None:
        type(self).resets += 1


def test_a_changed_token_cache_is_left_to_ray_with_one_warning(monkeypatch):
    monkeypatch.setattr(ray._raylet, "AuthenticationTokenLoader", _ChangedLoader)
    with pytest.warns(RuntimeWarning) as record:
        fray_ray._reload_token()
        fray_ray._reload_token()
    assert len(record) == 1
    assert str(record[0].message).startswith(
        "ray._raylet.AuthenticationTokenLoader is not as tested with Ray 2.60 (parameters "
        "{'instance': (), 'reset_cache': ('self', 'everything')}): Ray keeps the token of "
        "this process's first ray.init"
    )
    assert _ChangedLoader.resets == 0


def test_a_missing_token_cache_is_left_to_ray_with_one_warning(monkeypatch):
    monkeypatch.delattr(ray._raylet, "AuthenticationTokenLoader")
    with pytest.warns(RuntimeWarning, match=r"AuthenticationTokenLoader is not .* \(missing\)"):
        assert fray_ray.token_loader() is None
