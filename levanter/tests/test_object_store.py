"""A `gs://` run directory: train, then resume, against a local stand-in for the bucket.

`_fake_gcs` serves one directory both as an fsspec `gs://` filesystem (the path orbax's
metadata, the manifest and the run's metrics take, through `etils.epath`/fsspec, i.e. gcsfs in
production) and as a GCS JSON API server on 127.0.0.1 (the path orbax's arrays take, through
tensorstore's native `gcs` driver). See docs/design/levanter.md for what this does not prove.
"""

import json
import subprocess
import sys

import _fake_gcs
import _subprocess
import pytest

from meltemi.levanter.config import ConfigError, resolve_run_dir

BUCKET = "fake-bucket"
_WRAP = (
    "import os, runpy, sys; sys.path.insert(0, {tests!r}); import _fake_gcs; "
    "_fake_gcs.install_filesystem(os.environ[_fake_gcs.ROOT_ENV]); sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
).format(tests=str(_subprocess.TRAIN.parents[4] / "tests"))


def _train(server, cwd, cache, *overrides):
    train_and_flags = _subprocess.command(f"gs://{BUCKET}/runs/a", cache, *overrides)[1:]
    return subprocess.run(
        [sys.executable, "-c", _WRAP, *train_and_flags],
        env=_subprocess.env() | server.env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _metrics_steps(run):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()]


@pytest.mark.parametrize(
    "url, message",
    [
        ("s3://bucket/run", "only gs:// object storage is supported"),
        ("gs://bucket", "name a directory inside the bucket"),
    ],
)
def test_unsupported_object_store_urls_are_refused(url, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run_dir("run", url)


def test_a_run_trains_into_gs_and_resumes_from_it(tmp_path):
    root = tmp_path / "bucket-root"
    (root / BUCKET).mkdir(parents=True)
    with _fake_gcs.FakeGcsServer(root) as server:
        first = _train(server, tmp_path, tmp_path / "cache", "--config.eval.num_batches=0")
        assert first.returncode == 0, first.stderr[-3000:]
        uploads = server.requests.get("POST", 0)
        run = root / BUCKET / "runs" / "a"
        assert f"run dir: gs://{BUCKET}/runs/a" in first.stdout, first.stdout
        assert f"loss curve: gs://{BUCKET}/runs/a/loss.png" in first.stdout
        assert (run / "config.json").exists() and (run / "loss.png").exists()
        assert _metrics_steps(run) == [1, 2]
        step2 = run / "checkpoints" / "step_00000002"
        manifest = json.loads((step2 / "meltemi.json").read_text())
        assert manifest["step"] == 2 and manifest["files"]
        # The arrays went to the bucket through tensorstore's GCS driver (HTTP uploads), and
        # nothing was written to a local directory named like the URL.
        assert uploads >= 2 and list((step2 / "state").rglob("d/*"))
        assert not (tmp_path / "gs:").exists()

        again = _train(
            server, tmp_path, tmp_path / "cache", "--config.eval.num_batches=0",
            "--config.trainer.num_train_steps=4",
        )  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        resumed = f"resumed from gs://{BUCKET}/runs/a/checkpoints/step_00000002"
        assert resumed in again.stdout + again.stderr
        assert "run finished: step 4/4 (2 steps this run" in again.stdout, again.stdout
        assert _metrics_steps(run) == [1, 2, 3, 4]  # continued, not restarted or repeated
        assert (run / "checkpoints" / "step_00000004" / "meltemi.json").exists()
        assert server.requests.get("GET", 0) > 0  # the restore read arrays over HTTP
