"""RayCluster on a fresh machine: no writable home, no ~/.ray, no fixed temp dir.

Ray 2.60 turns token authentication on for the clusters `ray.init()` starts and writes the
token to `~/.ray/auth_token`; where HOME is read-only (Bazel's sandbox) that killed every Ray
test. These tests start fray's Ray backend in a subprocess whose HOME cannot be written, the
way a CI sandbox does it, and check that the token lives in fray's own session directory.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

ray = pytest.importorskip("ray")

from meltemi import fray  # noqa: E402
from meltemi.fray import ray as fray_ray  # noqa: E402

_RAY_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")

# Run in the child: proves HOME is really unwritable (root ignores chmod), then uses Ray.
_PREAMBLE = """
import json, os, stat, sys
home = os.environ["HOME"]
try:
    os.makedirs(os.path.join(home, ".ray"))
except OSError:
    pass
else:
    sys.exit("test premise broken: HOME is writable")
from meltemi.fray.ray import RayCluster


class Adder:
    def add(self, a, b):
        return a + b
"""


_RO_BIND = 'mount --bind -o ro "$HOME" "$HOME" && exec "$@"'


def _read_only_home(tmp_path) -> tuple[str, list[str]]:
    """An empty HOME the child cannot write, and the command prefix that makes it so."""
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)  # enough for a normal user; root writes anyway
    if os.geteuid() != 0:
        return str(home), []
    # Root: a read-only bind mount in a private mount namespace, as Bazel's sandbox does.
    prefix = ["unshare", "--mount", "sh", "-c", _RO_BIND, "sh"]
    if shutil.which("unshare"):
        probe = [*prefix, "sh", "-c", 'touch "$HOME/probe" 2>/dev/null && exit 1 || exit 0']
        env = {**os.environ, "HOME": str(home)}
        if subprocess.run(probe, env=env, capture_output=True, timeout=30).returncode == 0:
            return str(home), prefix
    blocker = tmp_path / "not-a-dir"  # else: HOME below a regular file (ENOTDIR)
    blocker.write_text("")
    return str(blocker / "home"), []


def _run_child(tmp_path, body: str, **env_overrides) -> subprocess.CompletedProcess:
    home, prefix = _read_only_home(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in _RAY_VARS}
    env.update(HOME=home, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    env.update(env_overrides)
    code = _PREAMBLE + textwrap.dedent(body)
    argv = [*prefix, sys.executable, "-c", code]
    return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)


def _last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ray_starts_and_serves_calls_with_a_read_only_home(tmp_path):
    proc = _run_child(
        tmp_path,
        """
        import ray

        with RayCluster(num_cpus=1) as cluster:
            token = os.environ["RAY_AUTH_TOKEN_PATH"]
            session = cluster._session.dir
            out = {
                "result": cluster.spawn(Adder).add(2, 3),
                "token_mode": stat.S_IMODE(os.stat(token).st_mode),
                "session_mode": stat.S_IMODE(os.stat(session).st_mode),
                "token_in_session": os.path.dirname(token) == session,
                "session_len": len(session),
                "ray_temp_dir": os.path.relpath(
                    ray._private.worker._global_node.get_temp_dir_path(), session
                ),
            }
        out["session_removed"] = not os.path.exists(session)
        out["env_restored"] = "RAY_AUTH_TOKEN_PATH" not in os.environ
        print(json.dumps(out))
        """,
    )
    out = _last_json(proc)
    assert out == {
        "result": 5,
        "token_mode": 0o600,
        "session_mode": 0o700,
        "token_in_session": True,
        "session_len": out["session_len"],
        "ray_temp_dir": "r",
        "session_removed": True,
        "env_restored": True,
    }
    assert out["session_len"] <= fray_ray._MAX_TEMP_BASE + len("/ray-XXXXXXXX")
    assert out["ray_temp_dir"] == "r"


def test_a_second_ray_cluster_in_one_process_gets_its_own_working_token(tmp_path):
    # Ray caches the token of the first ray.init; a stale one fails the second cluster.
    proc = _run_child(
        tmp_path,
        """
        results, tokens = [], []
        for k in range(2):
            with RayCluster(num_cpus=1) as cluster:
                tokens.append(open(os.environ["RAY_AUTH_TOKEN_PATH"]).read())
                results.append(cluster.spawn(Adder).add(k, 10))
        print(json.dumps({"results": results, "distinct": tokens[0] != tokens[1]}))
        """,
    )
    assert _last_json(proc) == {"results": [10, 11], "distinct": True}


def test_joining_a_cluster_without_its_token_names_the_setting(tmp_path):
    proc = _run_child(
        tmp_path,
        """
        from meltemi import fray
        try:
            RayCluster(address="127.0.0.1:9")
        except fray.FrayError as e:
            print(json.dumps({"type": type(e).__name__, "message": str(e)}))
        """,
        RAY_AUTH_MODE="token",
    )
    out = _last_json(proc)
    assert out["type"] == "AuthenticationError"
    assert "RayCluster(address='127.0.0.1:9')" in out["message"]
    assert "no authentication token was found" in out["message"]
    assert "set RAY_AUTH_TOKEN_PATH to a file holding the cluster's token" in out["message"]
    assert "Traceback" not in proc.stderr


def test_joining_without_sending_a_token_names_the_setting(monkeypatch):
    # Ray retries for ~20 s before this ConnectionError; simulate the failure it ends with.
    def refuse(address=None, **kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(
        fray.AuthenticationError,
        match=r"RayCluster\(address='10.1.2.3:6379'\): could not connect .* sent no token "
        r"\(RAY_AUTH_MODE=<unset>\).* set RAY_AUTH_TOKEN_PATH .* and RAY_AUTH_MODE=token",
    ):
        fray_ray.RayCluster(address="10.1.2.3:6379")


def test_a_token_path_naming_no_file_is_refused_before_ray_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: pytest.fail("ray.init must not be called"))
    missing = tmp_path / "no-token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(missing))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(
        fray.AuthenticationError,
        match=rf"RAY_AUTH_TOKEN_PATH='{missing}' names no readable, non-empty token file; .*"
        "unset RAY_AUTH_TOKEN_PATH",
    ):
        fray_ray.RayCluster()


def test_ray_temp_dir_falls_back_to_tmp_when_tmpdir_is_too_long(monkeypatch, tmp_path):
    # Ray's socket paths (<temp dir>/session_.../sockets/plasma_store) must fit in 107 bytes.
    long_dir = tmp_path / ("d" * 60)
    long_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_dir))
    assert fray_ray._session_base() == "/tmp"
    short = tempfile.mkdtemp(prefix="t-", dir="/tmp")
    try:
        monkeypatch.setattr(tempfile, "tempdir", short)
        assert fray_ray._session_base() == short
    finally:
        os.rmdir(short)


def test_fray_started_ray_uses_a_fresh_private_temp_dir(monkeypatch):
    started = {}

    def fake_init(address=None, **kwargs):
        started.update(kwargs, token=os.environ.get("RAY_AUTH_TOKEN_PATH"))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    for var in _RAY_VARS:
        monkeypatch.delenv(var, raising=False)
    dirs = []
    for _ in range(2):
        cluster = fray_ray.RayCluster()
        session = os.path.dirname(started["_temp_dir"])
        dirs.append(session)
        assert started["token"] == os.path.join(session, "auth_token")
        assert stat.S_IMODE(os.stat(session).st_mode) == 0o700
        cluster.shutdown()
        assert not os.path.exists(dirs[-1])
        assert "RAY_AUTH_TOKEN_PATH" not in os.environ
    assert dirs[0] != dirs[1]


def test_bench_prints_one_error_line_when_ray_cannot_start(tmp_path):
    bench = os.path.join(os.path.dirname(__file__), "..", "bin", "bench.py")
    env = {k: v for k, v in os.environ.items() if k not in _RAY_VARS}
    env.update(
        HOME=str(tmp_path),  # should a regression write a token, it lands here
        RAY_AUTH_TOKEN_PATH=str(tmp_path / "missing"),
        PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path),
    )
    proc = subprocess.run(
        [sys.executable, bench, "--quick", "--backends=ray"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(
        f"error: RAY_AUTH_TOKEN_PATH='{tmp_path / 'missing'}' names no readable"
    )
    assert "Traceback" not in proc.stderr
