"""A realistic runs folder for dashboard tests, and the server on a free port in a thread.

    folder = build_runs_folder(tmp_path / "runs")  # ~30 s: trains the tiny run once
    with folder.live_run, DashboardServer(folder.root) as url:  # live appends start/stop
        requests.get(url + "api/runs")

The folder holds (run ids):
  tiny                 the default config's smoke variant trained for real (6 steps, evals at
                       3 and 6, a final checkpoint with checksums): state finished
  failed               a copy of tiny's first 4 steps, one corrupt and one half-written line,
                       and a status.json with state failed
  live                 1000 planned steps; `folder.live_run` appends one line every
                       `live_interval_s` while it is started: state running
  elastic              2 slices wanted, 1 running (slice 1 lost, restarted twice), lost and
                       shrink events in status.json: state degraded
  mixture              a two-component mixture (0.75/0.25, then 0.5/0.5 from step 10) whose
                       data/<c>/fraction follow the weights; steps 7 and 12 skipped
  sweep/runs/<name>    the runs of an isoflop sweep (`sweep` holds isoflop.json fitted by the
                       real fit, prediction.json and verification.json)
Only `tiny` is trained; the others are written as the trainer/launcher/isoflop would.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shutil
import threading
import time

from meltemi.levanter.config import load_config
from meltemi.levanter.experiments import Point, bootstrap, fit, fit_json
from meltemi.levanter.status import JobStatus, SliceStatus
from meltemi.levanter.trainer import train

DEFAULT = pathlib.Path(__file__).parent.parent / "configs" / "default.py"
TINY_STEPS = 6


def train_tiny(run_dir: pathlib.Path, cache_dir: pathlib.Path, steps: int = TINY_STEPS) -> None:
    """The default config's smoke variant for `steps` steps, evaluated every 3 (in process)."""
    resolved = load_config(
        f"{DEFAULT}:smoke",
        [
            ("name", "tiny"),
            ("run_dir", str(run_dir)),
            ("data.cache_dir", str(cache_dir)),
            ("trainer.num_train_steps", str(steps)),
            ("eval.every_steps", "3"),
            ("checkpoint.save_every_steps", str(steps)),
        ],
    )
    train(resolved)


def _lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_run(
    run_dir: pathlib.Path, config: dict, rows: list[dict], *, name: str, overrides: dict
) -> None:
    """A run directory as the trainer leaves it: config.json (with provenance) and metrics."""
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = json.loads(json.dumps(config))
    saved["config"]["name"] = name
    saved["config"]["run_dir"] = str(run_dir)
    saved["provenance"]["run_dir"] = "flag"
    for key, value in overrides.items():
        node = saved["config"]
        *path, leaf = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = value
        saved["provenance"][key] = "flag"
    (run_dir / "config.json").write_text(json.dumps(saved, indent=1))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _synthetic_row(template: dict, step: int, loss: float) -> dict:
    row = {k: v for k, v in template.items() if not k.startswith("eval/")}
    row.update({"step": step, "train/loss": loss})
    return row


class LiveRun:
    """Appends one metrics line every `interval_s` to a run while started (a context manager).

    Attributes:
        path: the metrics.jsonl it appends to.
        step: the last step written.
    """

    def __init__(self, path: pathlib.Path, template: dict, step: int, interval_s: float):
        self.path = path
        self.template = template
        self.step = step
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def append(self, n: int = 1) -> int:
        """Writes `n` more lines now; returns the last step."""
        with open(self.path, "a") as f:
            for _ in range(n):
                self.step += 1
                f.write(
                    json.dumps(
                        _synthetic_row(self.template, self.step, 5.0 / (1 + 0.01 * self.step))
                    )
                    + "\n"
                )
        return self.step

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.append()

    def start(self) -> LiveRun:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="live-run", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> LiveRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclasses.dataclass
class RunsFolder:
    """What `build_runs_folder` made (run ids are paths relative to `root`)."""

    root: pathlib.Path
    live_run: LiveRun
    tiny: str = "tiny"
    failed: str = "failed"
    live: str = "live"
    elastic: str = "elastic"
    mixture: str = "mixture"
    sweep: str = "sweep"
    sweep_runs: tuple[str, ...] = ()


def build_runs_folder(
    root: pathlib.Path, *, tiny_run: pathlib.Path | None = None, live_interval_s: float = 0.5
) -> RunsFolder:
    """Builds the folder described in the module docstring under `root`.

    Args:
        root: the runs folder to create.
        tiny_run: an already trained tiny run directory to copy (skips the ~30 s training).
        live_interval_s: seconds between the lines `live_run` appends once started.
    """
    root.mkdir(parents=True, exist_ok=True)
    cache = root.parent / f"{root.name}-data-cache"
    if tiny_run is None:
        train_tiny(root / "tiny", cache)
    elif tiny_run.resolve() != (root / "tiny").resolve():
        shutil.copytree(tiny_run, root / "tiny", dirs_exist_ok=True)
    config = json.loads((root / "tiny" / "config.json").read_text())
    rows = _lines(root / "tiny" / "metrics.jsonl")
    template = rows[-1]

    # failed: 4 steps, a corrupt line in the middle, a half-written last line, status failed.
    failed = root / "failed"
    _write_run(failed, config, rows[:2], name="failed", overrides={})
    with open(failed / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "train/loss": 5.1, "optim/gra\n')  # a line cut by a crash
        for row in rows[2:4]:
            f.write(json.dumps(row) + "\n")
        f.write('{"step": 5, "train/lo')  # half-written, no newline
    JobStatus(
        state="failed",
        target_slices=1,
        min_slices=1,
        num_slices=0,
        step=4,
        reason="slice 0 exited with status 1",
        slices=[
            SliceStatus(
                0,
                state="done",
                last_exit="exit 1",
                restarts=0,
                peak_rss_mb=812.0,
                started_at=time.time() - 60,
                ended_at=time.time() - 5,
            )
        ],
    ).write(failed)

    # live: 1000 planned steps, 10 written; LiveRun appends more.
    live = root / "live"
    _write_run(
        live,
        config,
        [_synthetic_row(template, s, 5.0 / (1 + 0.01 * s)) for s in range(1, 11)],
        name="live",
        overrides={"trainer.num_train_steps": 1000},
    )
    live_run = LiveRun(live / "metrics.jsonl", template, 10, live_interval_s)

    # elastic: 2 slices wanted, 1 running after slice 1 was lost twice.
    elastic = root / "elastic"
    _write_run(
        elastic,
        config,
        [
            _synthetic_row(template, s, 5.0 - 0.1 * s) | {"mesh/num_slices": 2 if s <= 5 else 1}
            for s in range(1, 9)
        ],
        name="elastic",
        overrides={"mesh.num_slices": 2, "mesh.min_slices": 1, "trainer.num_train_steps": 50},
    )
    now = time.time()
    JobStatus(
        state="running",
        target_slices=2,
        min_slices=1,
        num_slices=1,
        step=8,
        generation=3,
        reason="slice 1 lost; training on 1 of 2 slices",
        slices=[
            SliceStatus(
                0,
                state="running",
                pid=4242,
                restarts=0,
                started_at=now - 120,
                peak_rss_mb=1024.5,
                step=8,
            ),
            SliceStatus(
                1,
                state="lost",
                pid=None,
                restarts=2,
                last_exit="SIGKILL",
                started_at=now - 90,
                ended_at=now - 30,
                peak_rss_mb=998.0,
                step=5,  # lost after step 5 (mesh/num_slices drops to 1 after it)
                reason="its process was killed (SIGKILL)",
            ),
        ],
        events=[
            {"time": now - 100, "kind": "lost", "reason": "slice 1: SIGKILL"},
            {"time": now - 95, "kind": "grow", "reason": "slice 1 rejoined at step 4"},
            {"time": now - 30, "kind": "lost", "reason": "slice 1: SIGKILL"},
            {"time": now - 29, "kind": "shrink", "reason": "2 -> 1 slices from step 5"},
        ],
    ).write(elastic)

    # mixture: 0.75/0.25 then 0.5/0.5 from data step 10 (metrics step 11); two skipped steps.
    mixture_rows = []
    for s in range(1, 21):
        a = 0.75 if s - 1 < 10 else 0.5
        row = _synthetic_row(template, s, 5.0 - 0.05 * s) | {
            "data/code/fraction": a,
            "data/prose/fraction": 1 - a,
            "optim/skipped": 1.0 if s in (7, 12) else 0.0,
            "optim/skip/skipped": 1.0 if s in (7, 12) else 0.0,
            "optim/skip/reason": {7: 4.0, 12: 9.0}.get(s, 0.0),
        }
        if s % 10 == 0:
            row |= {
                "eval/code/loss": 4.0 - 0.1 * s,
                "eval/code/bpb": 6.0 - 0.1 * s,
                "harness/arc_easy/acc": 0.25 + 0.01 * s,
            }
        mixture_rows.append(row)
    _write_run(
        root / "mixture",
        config,
        mixture_rows,
        name="mixture",
        overrides={
            "trainer.num_train_steps": 20,
            "data.source": "mixture",
            "data.components": {
                "code": {
                    "source": "stdlib:train",
                    "weight": 0.75,
                    "validation": "stdlib:validation",
                },
                "prose": {"source": "text:/data/prose/*.txt", "weight": 0.25, "validation": ""},
            },
            "data.weight_stages": [[10, {"code": 0.5, "prose": 0.5}]],
        },
    )

    sweep_runs = _write_sweep(root / "sweep", config, template)
    return RunsFolder(
        root=root, live_run=live_run, sweep_runs=tuple(f"sweep/runs/{n}" for n in sweep_runs)
    )


def _write_sweep(sweep: pathlib.Path, config: dict, template: dict) -> list[str]:
    """An isoflop sweep of 2 budgets x 4 sizes on a known law, fitted by the real fit."""
    records, names = [], []
    for budget in (1e12, 4e12):
        for n in (2e4, 6e4, 2e5, 6e5):
            tokens = budget / (6 * n)
            loss = 2.0 + 0.3 * (math.log10(n) - 0.45 * math.log10(budget) + 0.4) ** 2
            loss += 0.5 * (budget / 1e12) ** -0.1
            name = f"n{n:.0e}-c{budget:.0e}".replace("+", "")
            names.append(name)
            run_dir = sweep / "runs" / name
            _write_run(
                run_dir,
                config,
                [_synthetic_row(template, s, loss + 1.0 / s) for s in range(1, 6)],
                name=name,
                overrides={"trainer.num_train_steps": 5},
            )
            records.append(
                {
                    "run": name,
                    "budget": budget,
                    "n_params": n,
                    "tokens": tokens,
                    "loss": loss,
                    "run_dir": str(run_dir),
                }
            )
    points = [Point(r["budget"], r["n_params"], r["tokens"], r["loss"]) for r in records]
    f = fit(points, strict=False)
    boot = bootstrap(points, f, samples=20, confidence=0.9, seed=0, predict_at=(1.6e13,))
    iso = {
        "metric": "loss",
        "runs": records,
        "fit": fit_json(f),
        "bootstrap": {"confidence": 0.9, **boot},
    }
    (sweep / "isoflop.json").write_text(json.dumps(iso, indent=1, default=float))
    c = 1.6e13
    predicted = {"n_opt": f.n_law(c), "d_opt": f.d_law(c), "loss": f.loss_law(c)}
    interval = [predicted["loss"] - 0.02, predicted["loss"] + 0.02]
    prediction = {
        "budget": c,
        "predicted": {**predicted, "interval": {"loss": interval}},
        "model": {"loss": predicted["loss"], "interval": interval},
        "sha256": "0" * 64,
    }
    (sweep / "prediction.json").write_text(json.dumps(prediction, indent=1, default=float))
    actual = predicted["loss"] + 0.01
    verification = {
        "budget": c,
        "predicted": predicted["loss"],
        "interval": interval,
        "actual": actual,
        "relative_error": 0.01 / actual,
        "inside_interval": True,
    }
    (sweep / "verification.json").write_text(json.dumps(verification, indent=1, default=float))
    return names
