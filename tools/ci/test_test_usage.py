"""`test_usage.read_usage` finds the usage line of every target and shard."""

import json

from tools.ci import test_usage


def test_reads_targets_and_shards(tmp_path, capsys):
    logs = tmp_path / "bazel-testlogs"
    (logs / "levanter/test_sft").mkdir(parents=True)
    (logs / "levanter/test_sft/test.log").write_text(
        "noise\nmeltemi-test-usage " + json.dumps({"wall_s": 10.0, "cpu_s": 9.0}) + "\n"
    )
    (logs / "fray/calls_test/shard_1_of_2").mkdir(parents=True)
    (logs / "fray/calls_test/shard_1_of_2/test.log").write_text(
        "meltemi-test-usage " + json.dumps({"wall_s": 20.0, "cpu_s": 2.0}) + "\n"
    )
    (logs / "tools/no_usage").mkdir(parents=True)
    (logs / "tools/no_usage/test.log").write_text("a sh_test prints no usage line\n")

    usage = test_usage.read_usage(logs)
    assert usage == {
        "fray/calls_test/shard_1_of_2": {"wall_s": 20.0, "cpu_s": 2.0},
        "levanter/test_sft": {"wall_s": 10.0, "cpu_s": 9.0},
    }
    assert test_usage.main(["test_usage", str(logs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["20.0", "2.0", "0.10", "fray/calls_test/shard_1_of_2"]
    assert out[-1].split()[:2] == ["30.0", "11.0"]


def test_top_keeps_the_slowest_and_the_total(tmp_path, capsys):
    logs = tmp_path / "bazel-testlogs"
    for name, wall in (("a", 1.0), ("b", 3.0), ("c", 2.0)):
        (logs / name).mkdir(parents=True)
        (logs / name / "test.log").write_text(
            "meltemi-test-usage " + json.dumps({"wall_s": wall, "cpu_s": 1.0}) + "\n"
        )
    assert test_usage.main(["test_usage", str(logs), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in out[:2]] == ["b", "c"]
    assert out[2].split()[:2] == ["6.0", "3.0"] and len(out) == 3
