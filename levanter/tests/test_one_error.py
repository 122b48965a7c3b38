"""The tests' `one_error_line` helper fails on what is not one error line."""

import pytest
from _one_error import one_error_line


def test_one_line_after_logs_and_warnings_is_returned():
    stderr = (
        "data: 696 documents kept\n"
        "E1126 13:28:52.781534 140307829331648 future.py:387] a commit thread failed\n"
        "error: saving the checkpoint of step 1 failed\n"
        "sys:1: RuntimeWarning: coroutine '_create_paths' was never awaited\n"
        "RuntimeWarning: Enable tracemalloc to get the object allocation traceback\n"
    )
    assert one_error_line(stderr) == "error: saving the checkpoint of step 1 failed"


@pytest.mark.parametrize(
    "stderr",
    [
        "error: slice 0 raised: OSError\n--- remote traceback ---\n  File 'x.py', line 3\n",
        "error: the config has no key `trainer.seeed`\n  Did you mean `trainer.seed`?\n",
        "error: first line\n\nmore after a blank line\n",
    ],
    ids=["remote_traceback", "indented_hint", "after_a_blank_line"],
)
def test_a_message_over_several_lines_fails(stderr):
    with pytest.raises(AssertionError, match="goes on over"):
        one_error_line(stderr)


def test_two_error_lines_fail():
    with pytest.raises(AssertionError, match="2 `error:` lines"):
        one_error_line("error: one\nerror: two\n")


def test_no_error_line_fails():
    with pytest.raises(AssertionError, match="0 `error:` lines"):
        one_error_line("I1126 13:28:52.781534 1 x.py:1] all fine\n")


def test_a_traceback_fails():
    stderr = "Traceback (most recent call last):\n  File 'x.py'\nKeyError: 'a'\nerror: a\n"
    with pytest.raises(AssertionError):
        one_error_line(stderr)
