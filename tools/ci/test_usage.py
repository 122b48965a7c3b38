"""Wall and CPU seconds of every test target of the last `bazel test`, slowest first.

Each pytest target prints a `meltemi-test-usage {"wall_s": .., "cpu_s": ..}` line
(`tools/python/pytest_main.py`). A target whose CPU is far below its wall time mostly waits
(subprocesses it does not reap, sleeps, sockets): those are the ones extra test parallelism helps.

    python3 tools/ci/test_usage.py [bazel-testlogs] [--top N]
"""

import json
import pathlib
import sys

_MARK = "meltemi-test-usage "


def read_usage(testlogs: pathlib.Path) -> dict[str, dict[str, float]]:
    """Maps each target (with its shard) to the usage line of its last test.log."""
    found = {}
    for log in sorted(testlogs.rglob("test.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(_MARK):
                target = str(log.parent.relative_to(testlogs))
                found[target] = json.loads(line[len(_MARK) :])
    return found


def main(argv: list[str]) -> int:
    args = argv[1:]
    top = None
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i : i + 2]
    testlogs = pathlib.Path(args[0] if args else "bazel-testlogs").resolve()
    usage = read_usage(testlogs)
    rows = sorted(usage.items(), key=lambda kv: -kv[1]["wall_s"])[:top]
    wall = sum(u["wall_s"] for u in usage.values())
    cpu = sum(u["cpu_s"] for u in usage.values())
    for target, u in rows:
        ratio = u["cpu_s"] / u["wall_s"] if u["wall_s"] else 0.0
        print(f"{u['wall_s']:8.1f} {u['cpu_s']:8.1f} {ratio:5.2f}  {target}")
    print(f"{wall:8.1f} {cpu:8.1f}        total of {len(usage)} targets (wall, cpu)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
