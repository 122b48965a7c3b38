"""The private JAX and orbax APIs levanter uses are exactly as tested on the pinned versions,
and a changed one falls back to the public behaviour with one warning.

On the pinned versions (third_party/requirements.lock) no fallback may be taken: the first
tests fail if the guards in `multislice._slice_worker` or `checkpoint._manager` reject them. The
others change one private signature and check the public behaviour and the single warning.
"""

from __future__ import annotations

import inspect
import itertools
import threading
import time
import warnings

import pytest
from jax._src import compilation_cache, compiler, distributed
from orbax.checkpoint._src.futures import future, synchronization

from meltemi.levanter import _private_api
from meltemi.levanter.checkpoint._manager import orbax_thread_api, release_orbax_threads
from meltemi.levanter.multislice._slice_worker import (
    jax_cache_hooks,
    write_compile_cache_from_every_rank,
)


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test sees a process that has warned about nothing and has JAX's own cache writer."""
    monkeypatch.setattr(_private_api, "_warned", set())
    monkeypatch.setattr(compiler, "_cache_write", compiler._cache_write)


class _CpuBackend:
    platform = "cpu"


def _recording_put(written: list):
    def put_executable_and_time(cache_key, module_name, executable, backend, compile_time):
        written.append((cache_key, module_name, executable, compile_time))

    return put_executable_and_time


_OPERATIONS = itertools.count()


def _waiting_commit_thread() -> threading.Thread:
    """An orbax commit thread waiting, as after a failed save, for a signal nobody sends."""
    ran = []
    thread = future._SignalingThread(
        target=lambda: ran.append(True),
        send_signals=(),
        receive_signals=[synchronization.HandlerAwaitableSignal.STEP_DIRECTORY_CREATION],
        timeout_secs=120,
        operation_id=f"meltemi-test-{next(_OPERATIONS)}",  # a signal, once sent, stays
    )
    thread.ran = ran
    thread.start()
    return thread


def test_the_pinned_jax_has_the_compile_cache_hooks():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jax_cache_hooks() is not None


def test_the_pinned_orbax_has_the_commit_thread_api():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert orbax_thread_api() is future


def test_every_rank_writes_its_compile_cache_entries_on_the_pinned_jax(monkeypatch):
    written = []
    monkeypatch.setattr(compilation_cache, "put_executable_and_time", _recording_put(written))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert write_compile_cache_from_every_rank()
    monkeypatch.setattr(distributed.global_state, "process_id", 1)
    compiler._cache_write("key", 5.0, "jit_f", _CpuBackend(), "executable", [])
    assert written == [("key", "jit_f", "executable", 5)]


def test_a_changed_cache_writer_keeps_jax_s_and_warns_once(monkeypatch):
    written = []
    put = _recording_put(written)

    def changed_put(cache_key, module_name, executable, backend, compile_time, extra=None):
        put(cache_key, module_name, executable, backend, compile_time)

    monkeypatch.setattr(compilation_cache, "put_executable_and_time", changed_put)
    jax_writer = compiler._cache_write
    with pytest.warns(_private_api.PrivateApiWarning) as record:
        assert not write_compile_cache_from_every_rank()
        assert not write_compile_cache_from_every_rank()
    assert len(record) == 1
    assert (
        record[0]
        .message.args[0]
        .startswith(
            "jax._src.compilation_cache.put_executable_and_time is not as tested (parameters "
            "('cache_key', 'module_name', 'executable', 'backend', 'compile_time', 'extra'));"
            " only process 0 writes compile-cache entries, as in JAX"
        )
    )
    assert compiler._cache_write is jax_writer
    monkeypatch.setattr(distributed.global_state, "process_id", 1)
    compiler._cache_write("key", 5.0, "jit_f", _CpuBackend(), "executable", [])
    assert written == []  # JAX's writer: rank 1 writes nothing


def test_a_cache_write_with_a_changed_signature_is_not_replaced(monkeypatch):
    def cache_write(cache_key, compile_time_secs, module_name, backend, executable):
        pass

    monkeypatch.setattr(compiler, "_cache_write", cache_write)
    with pytest.warns(_private_api.PrivateApiWarning, match=r"_cache_write is not as tested"):
        assert not write_compile_cache_from_every_rank()
    assert compiler._cache_write is cache_write


def test_a_missing_process_id_falls_back(monkeypatch):
    monkeypatch.setattr(distributed, "global_state", object())
    with pytest.warns(_private_api.PrivateApiWarning, match=r"global_state\.process_id .*missing"):
        assert jax_cache_hooks() is None


def test_a_waiting_commit_thread_is_released_on_the_pinned_orbax():
    thread = _waiting_commit_thread()
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert release_orbax_threads() == 1
    threading.Thread.join(thread, timeout=30)  # orbax's join raises when cancelled
    assert not thread.is_alive()
    assert time.monotonic() - start < 30 and thread.ran == []  # woke cancelled, wrote nothing


def test_a_changed_orbax_signal_call_releases_none_and_warns_once(monkeypatch):
    def changed_set_signals(send_signals, *, operation_id, timeout_secs=None):
        pass

    thread = _waiting_commit_thread()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(future, "set_signals", changed_set_signals)
            with pytest.warns(_private_api.PrivateApiWarning) as record:
                assert release_orbax_threads() == 0
                assert release_orbax_threads() == 0
        assert len(record) == 1
        assert (
            record[0]
            .message.args[0]
            .startswith(
                "orbax.checkpoint._src.futures.future.set_signals is not as tested (parameters "
                "('send_signals', 'operation_id', 'timeout_secs')); a failed save's orbax commit "
                "threads are not released"
            )
        )
        assert thread.is_alive()  # left to orbax's own timeout
    finally:
        thread.cancel()
        future.set_signals(thread._receive_signals, operation_id=thread._operation_id)
        threading.Thread.join(thread, timeout=30)  # orbax's join raises when cancelled


def test_orbax_threads_without_the_tested_attributes_are_left_alone(monkeypatch):
    class Renamed(future._SignalingThread):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._signals_to_receive = self.__dict__.pop("_receive_signals")

    # Same signature as the tested class, different attributes.
    Renamed.__init__.__signature__ = inspect.signature(future._SignalingThread.__init__)
    monkeypatch.setattr(future, "_SignalingThread", Renamed)
    with pytest.warns(_private_api.PrivateApiWarning, match=r"_SignalingThread is not as tested"):
        assert orbax_thread_api() is None


def test_an_orbax_thread_that_cannot_be_built_falls_back_without_raising(monkeypatch):
    class Refusing(future._SignalingThread):
        def __init__(self, **kwargs):
            raise ValueError("needs a coordination service")

    Refusing.__init__.__signature__ = inspect.signature(future._SignalingThread.__init__)
    monkeypatch.setattr(future, "_SignalingThread", Refusing)
    with pytest.warns(_private_api.PrivateApiWarning, match=r"cannot be built: ValueError"):
        assert release_orbax_threads() == 0
