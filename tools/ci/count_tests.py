"""Counts passed and failed test targets from Bazel's build-event JSON file.

Usage: count_tests.py BEP.json TESTS.txt   ->  prints "<passed> <failed>"

TESTS.txt lists every test target (`bazel query 'tests(//...)'`). A target passed when its
`testSummary` event says PASSED (or FLAKY); every other listed target failed, including one that
failed to build and so never ran.
"""

from __future__ import annotations

import json
import sys


def passed_labels(bep_lines: list[str]) -> set[str]:
    """Labels whose testSummary is PASSED or FLAKY."""
    passed = set()
    for line in bep_lines:
        if not line.strip():
            continue
        event = json.loads(line)
        summary_id = event.get("id", {}).get("testSummary")
        if summary_id and event.get("testSummary", {}).get("overallStatus") in ("PASSED", "FLAKY"):
            passed.add(summary_id["label"])
    return passed


def count(bep_lines: list[str], test_labels: list[str]) -> tuple[int, int]:
    """Returns (passed, failed) over `test_labels`."""
    labels = {t.strip() for t in test_labels if t.strip()}
    passed = len(labels & passed_labels(bep_lines))
    return passed, len(labels) - passed


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def main(argv: list[str]) -> int:
    passed, failed = count(_lines(argv[0]), _lines(argv[1]))
    print(passed, failed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
