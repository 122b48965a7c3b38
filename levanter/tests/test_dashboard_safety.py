"""The dashboard's safety rules: paths outside the runs folder, the token, the bind address.

Hand-written run directories only (no training): each test builds the few files it needs.
"""

import json
import logging
import os
import re
import socket
import subprocess
import sys

import _subprocess
import httpx
import pytest
from fastapi.testclient import TestClient

from meltemi.levanter.dashboard import (
    TOKEN_ENV,
    BindError,
    DashboardServer,
    OutsideRootError,
    RunsRoot,
    check_bind,
    create_app,
    token_matches,
)

TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def tree(tmp_path):
    """runs/ok (a run), runs/link-out -> secret/ (outside), runs/link-in -> runs/ok, and a
    secret run outside the folder."""
    root = tmp_path / "runs"
    for run in (root / "ok", tmp_path / "secret"):
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 2.5}\n')
        (run / "config.json").write_text(
            json.dumps(
                {"config": {"name": run.name}, "provenance": {}, "spec": "", "overrides": []}
            )
        )
    os.symlink(tmp_path / "secret", root / "link-out")
    os.symlink(root / "ok", root / "link-in")
    return root


@pytest.mark.parametrize(
    "url",
    [
        "/api/runs/../secret/metrics",
        "/api/runs/..%2fsecret/metrics",
        "/api/runs/..%2Fsecret",
        "/api/runs/%2e%2e%2fsecret/slices",
        "/api/runs/ok/..%2f..%2fsecret/metrics",
        "/api/runs/%2Fetc/metrics",
        "/api/runs/link-out/metrics",
        "/api/runs/link-out",
        "/api/runs/link-out/provenance?step=1&row=0",
        "/api/sweeps/..%2fsecret",
        "/api/compare?runs=ok,..%2fsecret",
        "/api/compare?runs=ok,/etc",
    ],
)
def test_paths_outside_the_folder_are_refused(tree, url):
    response = TestClient(create_app(tree)).get(url)
    assert response.status_code in (403, 404), response.text
    if response.status_code == 404:  # the URL layer resolved `..` away: it names no run
        assert "secret" not in response.text or "no such" in response.text
    assert "2.5" not in response.text  # the secret run's loss never leaks


@pytest.mark.parametrize(
    "url",
    ["/api/runs/..%2fsecret/metrics", "/api/runs/link-out/metrics", "/api/runs/%2Fetc/metrics"],
)
def test_traversal_is_a_403_naming_the_refusal(tree, url):
    response = TestClient(create_app(tree)).get(url)
    assert response.status_code == 403
    assert response.json()["error"].startswith("path ")


def test_static_files_linked_from_elsewhere_are_served_but_nothing_beside_them(tree, tmp_path):
    real = tmp_path / "real"  # Bazel's runfiles link each file of static/ from the source tree
    real.mkdir()
    (real / "index.html").write_text("<!doctype html><title>dash</title>")
    static = tmp_path / "static"
    static.mkdir()
    os.symlink(real / "index.html", static / "index.html")
    client = TestClient(create_app(tree, static_dir=static))
    assert client.get("/").text == "<!doctype html><title>dash</title>"
    for url in ("/..%2freal/index.html", "/%2e%2e/secret/metrics.jsonl", "/../secret/config.json"):
        response = client.get(url)
        assert response.status_code == 404 and "2.5" not in response.text


def test_runs_root_refuses_dotdot_absolute_and_symlinks_out(tree):
    root = RunsRoot(tree)
    assert root.path("ok", "metrics.jsonl") == str(tree.resolve() / "ok" / "metrics.jsonl")
    assert root.path("link-in") == str(tree.resolve() / "ok")  # a symlink inside is fine
    with pytest.raises(OutsideRootError, match=r"path '\.\./secret': '\.\.' is refused"):
        root.path("../secret")
    with pytest.raises(OutsideRootError, match="absolute paths are refused"):
        root.path("/etc/passwd")
    with pytest.raises(OutsideRootError, match="resolves outside the runs folder"):
        root.path("link-out", "metrics.jsonl")


def test_the_scan_lists_no_run_behind_a_symlink(tree):
    ids = [r["id"] for r in TestClient(create_app(tree)).get("/api/runs").json()["runs"]]
    assert ids == ["ok"]


def test_a_token_is_required_on_every_request_when_set(tree):
    client = TestClient(create_app(tree, token=TOKEN))
    for url in ("/api/runs", "/api/runs/ok/metrics", "/", "/api/info"):
        response = client.get(url)
        assert response.status_code == 401 and "token is required" in response.json()["error"]
    assert client.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/runs?token=" + TOKEN[:-1]).status_code == 401
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.get(f"/api/runs/ok/metrics?token={TOKEN}").json()["lines"] == 1
    assert TestClient(create_app(tree)).get("/api/runs").status_code == 200  # loopback: none


def test_token_comparison_is_exact():
    assert token_matches(TOKEN, TOKEN)
    assert not token_matches(TOKEN + "x", TOKEN) and not token_matches("", TOKEN)
    assert not token_matches(None, TOKEN)


def test_another_address_needs_a_long_token():
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    with pytest.raises(
        BindError,
        match=r"--host='0\.0\.0\.0' serves the dashboard beyond this "
        "machine, so it needs a token: pass --token",
    ):
        check_bind("0.0.0.0", None)
    with pytest.raises(BindError, match="--token has 5 characters; use at least 16"):
        check_bind("0.0.0.0", "short")
    check_bind("0.0.0.0", TOKEN)
    with pytest.raises(BindError, match="needs a token"):
        DashboardServer(".", host="0.0.0.0")


def test_the_binary_refuses_another_address_without_a_token(tree):
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-m", "meltemi.levanter.dashboard", f"--runs={tree}", "--host=0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --host='0.0.0.0' serves the dashboard beyond this machine, so it needs a token: "
        f"pass --token=... or set {TOKEN_ENV} (e.g. `export {TOKEN_ENV}=$(openssl rand -hex 16)`);"
        " or keep the default --host=127.0.0.1 and use an SSH tunnel."
    ]


def test_the_trainer_refuses_a_dashboard_port_in_use(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = _subprocess.run(
            tmp_path / "runs" / "r", tmp_path / "cache", f"--dashboard_port={port}"
        )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        rf"error: --dashboard_port={port}: cannot listen there \(Address already in use\); pick "
        r"another port, e.g. --dashboard_port=\d+, or 0 for no dashboard\.",
        lines[0],
    ), done.stderr


def test_the_token_is_never_logged(tree, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    with DashboardServer(tree, token=TOKEN) as url:
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # as verbose as it gets
            caplog.set_level(logging.DEBUG, logger=name)
        assert httpx.get(f"{url}api/runs?token={TOKEN}").status_code == 200
        assert httpx.get(f"{url}api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).is_success
        assert httpx.get(f"{url}api/nothing?token={TOKEN}").status_code == 404
        assert httpx.get(f"{url}api/runs?token=nope").status_code == 401
    out, err = capfd.readouterr()
    server_logs = [
        r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))
    ]  # the client logs its URLs
    assert any(r.name.startswith("httpx") for r in caplog.records)  # logging was captured
    assert TOKEN not in out + err + "\n".join(server_logs)


def test_the_dashboard_server_is_the_shared_background_server():
    """One uvicorn-in-a-thread for the dashboard and models' OpenAI server, one free_port."""
    import meltemi.levanter.dashboard as dashboard
    from meltemi.models.serve import _background

    assert issubclass(DashboardServer, _background.BackgroundServer)
    assert dashboard.free_port is _background.free_port
