"""One experiment directory: the sweep, its fit, a preregistered prediction, its verification.

Layout of `run_dir` (the config's `run_dir`, default `runs/<name>`):

    runs/<run>/          one trainer run dir per run (config.json, metrics.jsonl, checkpoints,
                         result.json once finished)
    isoflop.json         every run, every fit, every interval
    isoflop.png          isoflop curves and the fitted frontier
    prediction.json      written before anything runs at the predicted budget; its sha256 is
                         also printed and logged to W&B (outside this directory, _prereg.py)
    verification.json    the verification run's loss against the prediction
    batch.json/.png      `--sweep=batch`
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import pathlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from meltemi.levanter.config import ResolvedConfig, RunSpec, resolve, resolve_run_dir
from meltemi.levanter.experiments._fit import (
    Fit,
    FitError,
    LossLaw,
    Parabola,
    PowerLaw,
    bootstrap,
    fit,
    fit_json,
    points_of,
)
from meltemi.levanter.experiments._ladder import Ladder, RunPlan, config_digest
from meltemi.levanter.experiments._plot import plot_batch, plot_isoflop
from meltemi.levanter.experiments._prereg import (
    EXPECT_FLAG,
    PREDICTION,
    check_prediction,
    load_prediction,
    payload_digest,
    preregistered_line,
    record_in_trackers,
)
from meltemi.levanter.experiments._runner import WorkerPool, make_cluster, read_result, run_all
from meltemi.levanter.experiments._spec import (
    SweepConfigError,
    SweepRunError,
    SweepSpec,
    sweep_spec,
)
from meltemi.levanter.trainer import Hook, build_parts


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_json(path: pathlib.Path, payload: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


class Experiment:
    """The experiment a config describes.

    Args:
        resolved: the loaded config: a trainer config with a `sweep` section.
        cluster: `local`, `ray` or `inprocess` (where the runs' workers live).
        log: where progress lines go (default: stderr).
        announce: where the `preregistered:` line goes, for the user to keep (default: stdout).
        hooks: `hooks(spec)` -> more step-boundary hooks for each run's trainer (a
            module-level function; `meltemi.levanter.main` passes the harness hook's), or None.
    """

    def __init__(
        self,
        resolved: ResolvedConfig,
        *,
        cluster: str = "local",
        log: Callable[[str], None] | None = None,
        announce: Callable[[str], None] | None = None,
        hooks: Callable[[RunSpec], Sequence[Hook]] | None = None,
    ):
        config = resolved.config
        if "sweep" not in config:
            raise SweepConfigError(
                f"{resolved.spec or 'the config'} has no `sweep` section; start from "
                "levanter/configs/isoflop.py (config.sweep = sweep_section())."
            )
        self.resolved = resolved
        self.sweep: SweepSpec = sweep_spec(config.sweep)
        self.run_dir = resolve_run_dir(config.name, config.run_dir)
        self.ladder = Ladder(resolved, self.sweep)
        self.cluster_kind = cluster
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.announce = announce or (lambda line: print(line, flush=True))
        # The digest of the prediction this object wrote, recorded outside the run dir then.
        self.preregistered_sha256: str | None = None
        self.timing: dict[str, float] = {}
        self._pool: WorkerPool | None = None
        self.hooks = hooks

    # -- running ------------------------------------------------------------------------------

    def run_dir_of(self, run: RunPlan) -> pathlib.Path:
        """Where a run's trainer run dir is."""
        return self.run_dir / "runs" / run.name

    def _new_pool(self) -> WorkerPool:
        # Compiled programs persist: a resumed run or a rerun does not compile again (the
        # lr schedule is a constant of the step, so runs with other step counts differ).
        cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(self.run_dir / "jax_cache")
        env = {"JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": cache}
        return WorkerPool(make_cluster(self.cluster_kind, env))

    @contextlib.contextmanager
    def workers(self) -> Iterator[None]:
        """Keeps the workers alive across `execute` calls (the sweep, then its verification),
        so that their imports and compiled programs stay warm."""
        if self._pool is not None:
            yield
            return
        self._pool = None if self.cluster_kind == "inprocess" else self._new_pool()
        try:
            yield
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown()

    def execute(self, runs: Sequence[RunPlan]) -> list[dict[str, Any]]:
        """Trains every run not finished yet (resuming killed ones); returns every record."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        configs, done, jobs = {}, {}, []
        for run in runs:
            cfg = self.ladder.run_config(run, str(self.run_dir_of(run)))
            digest = config_digest(cfg)
            configs[run.name] = cfg
            try:
                record = read_result(self.run_dir_of(run), digest)
            except ValueError as e:
                raise SweepConfigError(str(e)) from None
            if record is not None:
                done[run.name] = record
            else:
                jobs.append((run, cfg.to_json(), digest))
        if done:
            self.log(f"isoflop: {len(done)} of {len(runs)} runs already finished (skipped)")
        jobs.sort(key=lambda j: -j[0].flops)
        total = len(jobs)
        counter = iter(range(1, total + 1))

        def on_done(name: str, record: Mapping[str, Any]) -> None:
            value = self._metric(record)
            resumed = f", resumed at step {record['start_step']}" if record["start_step"] else ""
            self.log(
                f"isoflop: [{next(counter)}/{total}] {name}: {self.sweep.metric} {value:.4f} "
                f"({record['seconds']:.0f} s, {record['tokens_per_s']:,.0f} tok/s{resumed})"
            )

        if jobs:
            # The token stores are built once here: the workers only open them.
            self._timed("data_s", lambda: build_parts(resolve(configs[jobs[0][0].name])))
            pool = self._pool or self._new_pool()
            try:
                done.update(
                    run_all(
                        [(r.name, text, digest) for r, text, digest in jobs],
                        pool,
                        parallel=min(self.sweep.parallel, len(jobs)),
                        on_done=on_done,
                        hooks=self.hooks,
                    )
                )
            except RuntimeError as e:
                raise SweepRunError(str(e)) from None
            finally:
                if pool is not self._pool:
                    pool.shutdown()
        return [self._record(run, done[run.name]) for run in runs]

    def _metric(self, record: Mapping[str, Any]) -> float:
        evals = record["eval"]
        if not evals:
            raise SweepConfigError(
                "a run finished without an evaluation; set --config.eval.num_batches > 0."
            )
        name = self.sweep.eval_set or next(iter(evals))
        if name not in evals:
            raise SweepConfigError(
                f"sweep.eval_set={name!r}: the runs evaluate {sorted(evals)}; pick one."
            )
        return float(evals[name][self.sweep.metric])

    def _record(self, run: RunPlan, result: Mapping[str, Any]) -> dict[str, Any]:
        out = run.to_json()
        out.update(
            {
                self.sweep.metric: self._metric(result),
                "eval": result["eval"],
                "seconds": result["seconds"],
                "tokens_per_s": result["tokens_per_s"],
                "run_dir": str(self.run_dir_of(run)),
            }
        )
        return out

    def _timed(self, key: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.timing[key] = self.timing.get(key, 0.0) + time.perf_counter() - start

    # -- the isoflop sweep and its fit --------------------------------------------------------

    def sweep_and_fit(self, predict_at: Sequence[float] = ()) -> tuple[list[dict], Fit, dict]:
        """Runs the isoflop sweep, fits it and writes `isoflop.json` and `isoflop.png`."""
        runs = self.ladder.isoflop_runs()
        budgets = ", ".join(f"{c:.3g}" for c in self.sweep.budgets)
        self.log(
            f"isoflop: {len(runs)} runs, budgets {budgets} FLOPs, {self.sweep.parallel} at once;"
            f" run dir {self.run_dir}"
        )
        records = self._timed("sweep_s", lambda: self.execute(runs))
        points = points_of(records, self.sweep.metric)
        if not points:
            raise SweepConfigError("the sweep has no runs; check sweep.budgets and sweep.widths.")
        try:
            f = fit(points, strict=False)
        except FitError as e:
            raise SweepConfigError(f"fit: {e}") from None
        for line in f.excluded:
            self.log(f"isoflop: warning: left out of the laws: {line}")
        if not any(p.dof for p in f.parabolas):
            self.log(
                "isoflop: warning: no residual degrees of freedom (3 sizes per budget), so the "
                "run noise is unknown and the intervals are points; use sweep.sizes_per_budget>=4"
            )
        boot = bootstrap(
            points,
            f,
            samples=self.sweep.bootstrap,
            confidence=self.sweep.confidence,
            seed=self.sweep.seed,
            predict_at=predict_at,
        )
        self.write_isoflop(records, f, boot)
        return records, f, boot

    def write_isoflop(self, records, f: Fit, boot: Mapping[str, Any], **extra) -> None:
        """Writes `isoflop.json` and `isoflop.png` (with a prediction/verification if given)."""
        payload = {
            "created": _now(),
            "metric": self.sweep.metric,
            "flops": "C = flops_per_token * tokens; flops_per_token = 6N + 12*seq_len*heads*"
            "head_dim*layers (attention); N = non-embedding params + output head",
            "sweep": self.resolved.config.sweep.to_dict(),
            "runs": records,
            "fit": fit_json(f),
            "bootstrap": {"confidence": self.sweep.confidence, **boot},
            "noise_known": any(p.dof for p in f.parabolas),
            "edge_warnings": [
                f"budget {p.budget:.3g}: the minimum lies outside the sizes swept"
                for p in f.parabolas
                if p.at_edge
            ],
            "timing_s": dict(self.timing),
        }
        _write_json(self.run_dir / "isoflop.json", payload)
        plot_isoflop(
            self.run_dir / "isoflop.png",
            records,
            f,
            metric=self.sweep.metric,
            prediction=extra.get("prediction"),
            verification=extra.get("verification"),
        )

    # -- prediction and verification ----------------------------------------------------------

    def verify_plan(self, budget: float, n_opt: float) -> RunPlan:
        """The verification run: the ladder shape nearest N_opt, trained on `budget`."""
        return self.ladder.plan("verify", budget, self.ladder.nearest(n_opt))

    def predict(self, budget: float) -> dict[str, Any]:
        """Writes `prediction.json` for `budget` (or returns the one already written for it).

        Raises:
            SweepConfigError: a run at that budget exists without a prediction written before
                it, or `prediction.json` holds another budget or was edited.
        """
        path = self.run_dir / PREDICTION
        if path.is_file():
            existing = load_prediction(path)
            if not math.isclose(existing["budget"], budget, rel_tol=1e-9):
                raise SweepConfigError(
                    f"--predict={budget:.6g}: {path} already preregisters budget "
                    f"{existing['budget']:.6g}; use a new --config.run_dir for another budget."
                )
            self.log(f"isoflop: prediction for C={budget:.3g} already preregistered: {path}")
            return existing
        records, f, boot = self.sweep_and_fit(predict_at=[budget])
        pred = f.predict(budget)
        run = self.verify_plan(budget, pred["n_opt"])
        if self.run_dir_of(run).exists():
            raise SweepConfigError(
                f"--predict={budget:.6g}: {self.run_dir_of(run)} already exists, so a prediction "
                "written now would not be preregistered; use a new --config.run_dir."
            )
        key = f"predict@{budget:.6g}"
        iv = boot["intervals"]
        penalty = f.predict_model(budget, run.n_params) - pred["loss"]
        loss_iv = iv.get(f"{key}/loss", [pred["loss"], pred["loss"]])
        noise_known = any(p.dof for p in f.parabolas)
        if not noise_known:  # no residual dof: the refits only reproduce the point
            loss_iv = [pred["loss"], pred["loss"]]
        payload = {
            "created": _now(),
            "budget": budget,
            "metric": self.sweep.metric,
            "predicted": {
                **pred,
                "interval": {
                    "n_opt": iv.get(f"{key}/n_opt", [pred["n_opt"]] * 2),
                    "d_opt": iv.get(f"{key}/d_opt", [pred["d_opt"]] * 2),
                    "loss": loss_iv,
                },
                "confidence": self.sweep.confidence,
                "noise_known": noise_known,
            },
            "model": {
                **run.to_json(),
                "loss": pred["loss"] + penalty,
                "interval": [loss_iv[0] + penalty, loss_iv[1] + penalty],
                "curvature_penalty": penalty,
            },
            "inputs": {
                "points": [
                    {
                        "budget": r["budget"],
                        "n_params": r["n_params"],
                        "tokens": r["tokens"],
                        self.sweep.metric: r[self.sweep.metric],
                    }
                    for r in records
                ],
                "fit": fit_json(f),
                "bootstrap_samples": boot["samples"],
            },
        }
        payload["sha256"] = payload_digest(payload)
        _write_json(path, payload)
        # The digest leaves the run directory now, before anything runs at this budget.
        self.preregistered_sha256 = payload["sha256"]
        self.announce(preregistered_line(payload, path))
        config = self.resolved.config
        for where in record_in_trackers(payload, config.logging, self.run_dir, config.name):
            self.log(f"isoflop: prediction sha256 recorded in {where}")
        self.write_isoflop(records, f, boot, prediction=payload)
        self.log(
            f"isoflop: preregistered C={budget:.3g}: N_opt {pred['n_opt']:.3g}, D_opt "
            f"{pred['d_opt']:.3g}, {self.sweep.metric} {payload['model']['loss']:.4f} "
            f"[{payload['model']['interval'][0]:.4f}, {payload['model']['interval'][1]:.4f}] "
            f"-> {path} (sha256 {payload['sha256'][:12]})"
        )
        return payload

    def verify(
        self, budget: float | None = None, *, expect_sha256: str | None = None
    ) -> dict[str, Any]:
        """The whole experiment: sweep, fit, prediction, verification run; writes the JSONs.

        The verification run starts only if `prediction.json`'s digest is the one recorded
        outside the run directory: the one this call printed when it wrote the prediction,
        or `expect_sha256` (the digest the user kept) for a prediction written before.

        Raises:
            SweepConfigError: a prediction written before without `expect_sha256`, a digest
                that differs from `expect_sha256`, or `expect_sha256` without a prediction.
        """
        start = time.perf_counter()
        budget = budget or self.sweep.predict_factor * max(self.sweep.budgets)
        path = self.run_dir / PREDICTION
        source = EXPECT_FLAG
        if path.is_file() and expect_sha256 is None:
            raise SweepConfigError(
                f"{path} was preregistered by an earlier command: pass the digest of the "
                f"`preregistered:` line it printed, --verify {EXPECT_FLAG}=<hex> (also in the "
                "W&B run `<name>-prediction`, summary `prediction/sha256`), so that the file "
                "is checked against a record outside the run directory."
            )
        if path.is_file():
            check_prediction(path, expect_sha256, source)  # before anything runs
        elif expect_sha256 is not None:
            raise SweepConfigError(
                f"{EXPECT_FLAG}={expect_sha256}: {path} does not exist, so nothing was "
                "preregistered there; check --config.run_dir, or drop the flag to sweep, "
                "predict and verify in one command."
            )
        with self.workers():  # the sweep's workers train the verification run
            self.predict(budget)
            if expect_sha256 is None:
                expect_sha256, source = self.preregistered_sha256, "printed by this command"
            prediction = check_prediction(path, expect_sha256, source)
            model = prediction["model"]
            run = self.ladder.plan("verify", budget, self.ladder.shape(model["shape"]["width"]))
            record = self._timed("verify_s", lambda: self.execute([run])[0])
        actual = record[self.sweep.metric]
        lo, hi = model["interval"]
        result = {
            "created": _now(),
            "budget": budget,
            "metric": self.sweep.metric,
            "prediction_sha256": prediction["sha256"],
            "prediction_sha256_checked_against": source,
            "predicted": model["loss"],
            "interval": [lo, hi],
            "actual": actual,
            "relative_error": abs(actual - model["loss"]) / actual,
            "inside_interval": bool(lo <= actual <= hi),
            "frontier_relative_error": abs(actual - prediction["predicted"]["loss"]) / actual,
            "run": record,
            "seconds": time.perf_counter() - start,
            "timing_s": dict(self.timing),
        }
        _write_json(self.run_dir / "verification.json", result)
        iso = json.loads((self.run_dir / "isoflop.json").read_text())
        iso["timing_s"] = dict(self.timing)
        _write_json(self.run_dir / "isoflop.json", iso)
        records, f = iso["runs"], _fit_of(iso)
        plot_isoflop(
            self.run_dir / "isoflop.png",
            records,
            f,
            metric=self.sweep.metric,
            prediction=prediction,
            verification=result,
        )
        self.log(
            f"isoflop: verified C={budget:.3g}: {self.sweep.metric} {actual:.4f} vs predicted "
            f"{model['loss']:.4f} (relative error {result['relative_error']:.2%}, "
            f"{'inside' if result['inside_interval'] else 'outside'} the "
            f"{self.sweep.confidence:.0%} interval) -> {self.run_dir / 'verification.json'}"
        )
        return result

    # -- critical batch size ------------------------------------------------------------------

    def batch_sweep(self) -> dict[str, Any]:
        """`--sweep=batch`: loss against batch size at fixed budgets; writes batch.json/.png."""
        runs = self.ladder.batch_runs()
        self.log(f"isoflop: batch sweep, {len(runs)} runs; run dir {self.run_dir}")
        records = self._timed("sweep_s", lambda: self.execute(runs))
        metric = self.sweep.metric
        curves = []
        for budget in sorted({r["budget"] for r in records}):
            points = sorted(
                (r for r in records if r["budget"] == budget), key=lambda r: r["batch_size"]
            )
            best = min(r[metric] for r in points)
            ok = [
                r["batch_size"]
                for r in points
                if r[metric] <= best * (1 + self.sweep.batch_tolerance)
            ]
            curves.append(
                {"budget": budget, "points": points, "best": best, "critical_batch_size": max(ok)}
            )
        payload = {
            "created": _now(),
            "metric": metric,
            "tolerance": self.sweep.batch_tolerance,
            "rule": "critical batch size = the largest batch whose loss is within "
            "sweep.batch_tolerance of the best batch size's at the same compute",
            "budgets": curves,
            "timing_s": dict(self.timing),
        }
        _write_json(self.run_dir / "batch.json", payload)
        plot_batch(self.run_dir / "batch.png", payload, metric=metric)
        for c in curves:
            self.log(
                f"isoflop: C={c['budget']:.3g}: critical batch size {c['critical_batch_size']}"
            )
        return payload


def _fit_of(iso: Mapping[str, Any]) -> Fit:
    j = iso["fit"]
    law = j["loss_law"]
    return Fit(
        parabolas=tuple(Parabola(**p) for p in j["parabolas"]),
        n_law=PowerLaw(j["n_opt_law"]["k"], j["n_opt_law"]["a"]),
        d_law=PowerLaw(j["d_opt_law"]["k"], j["d_opt_law"]["b"]),
        loss_law=LossLaw(law["E"], law["A"], law["alpha"], law["C0"], law["E_fixed"]),
        sigma=j["sigma"],
        curvature=j["curvature"],
        excluded=tuple(j.get("excluded", ())),
    )
