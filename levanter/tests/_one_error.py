"""Checking that a command printed one `error: ...` line: no traceback, no second line."""

import re

# Lines a process may print after its error line that are not part of the message: absl log
# lines (`E1126 13:28:52.781534 ...`) and Python warnings (`sys:1: RuntimeWarning: ...`,
# orbax's coroutines reported at interpreter exit).
_NOT_THE_MESSAGE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ |(\S+:\d+: )?\w*Warning: )")


def one_error_line(stderr: str) -> str:
    """The single `error: ...` line of `stderr`; an AssertionError if the error is not one line.

    Fails on a traceback, on a second `error:` line, and on a message that goes on over more
    lines (any non-empty line after the error line other than a log line or a warning).
    """
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(errors) == 1, f"{len(errors)} `error:` lines in:\n{stderr[-3000:]}"
    rest = [ln for ln in lines[errors[0] + 1 :] if ln.strip() and not _NOT_THE_MESSAGE.match(ln)]
    assert not rest, f"the error message goes on over {len(rest) + 1} lines:\n{stderr[-3000:]}"
    return lines[errors[0]]
