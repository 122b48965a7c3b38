"""The CI counter counts a target that never ran as failed."""

import json

from tools.ci import count_tests


def _summary(label: str, status: str) -> str:
    return json.dumps(
        {"id": {"testSummary": {"label": label}}, "testSummary": {"overallStatus": status}}
    )


def test_counts_passed_flaky_and_failed():
    bep = [_summary("//a:t", "PASSED"), _summary("//b:t", "FLAKY"), _summary("//c:t", "FAILED")]
    assert count_tests.count(bep, ["//a:t", "//b:t", "//c:t"]) == (2, 1)


def test_a_target_that_did_not_build_is_failed():
    bep = [_summary("//a:t", "PASSED"), json.dumps({"id": {"progress": {}}})]
    assert count_tests.count(bep, ["//a:t", "//broken:t"]) == (1, 1)


def test_missing_event_file_counts_everything_failed(tmp_path):
    assert count_tests.count(count_tests._lines(str(tmp_path / "none.json")), ["//a:t"]) == (0, 1)
