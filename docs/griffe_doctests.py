"""A griffe extension for the site's API reference: doctests become code blocks.

Our docstrings show examples as bare doctests (`>>> ...` and their output) in the text, which
is what the doctest targets run. Markdown would read them as prose (and `[[0, 1]]` in an output
as a link reference), so for rendering each run of doctest lines is wrapped in a ```pycon
fence. Docstrings in the source are untouched.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.splitlines()
    i, in_fence = 0, False
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            block = []
            while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
                block.append(lines[i][len(indent) :])
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestsAsCode(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
