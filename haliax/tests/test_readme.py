"""The README's Haliax-idiom example runs unchanged, as a doctest (on 8 fake CPU devices)."""

import doctest
import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README has no section {title!r}"
    return m.group(1)


def test_haliax_idiom_example_runs_as_a_doctest():
    block = re.search(r"```python\n(.*?)```", _section("Haliax code runs unchanged"), re.S)
    assert block, "the section has no ```python block"
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.group(1), {}, "README", str(README), 0)
    assert len(test.examples) > 10
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} README examples failed (see output above)"


def test_readme_states_the_haliax_version_it_matches():
    assert "0.2.20.dev202606180959" in _section("Haliax code runs unchanged")
