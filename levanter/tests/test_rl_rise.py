"""GRPO raises held-out exact-match reward on rl_arithmetic.py (issue #36, done-when 1), on the
in-process backend and on fray's Ray backend, with the same figures on both.

The SFT set (configs/rl_data/make_arithmetic_sft.py) teaches carry-free two-digit sums with
two in three answers written `46.0`, which the exact-match reward refuses: the SFT model
answers in that format on held-out prompts too. RL learns the accepted format from the reward
alone, and the change carries over to held-out prompts it never trains on.

Measured (2026-11-27, seeds fixed; `:sft` = 800 steps, then `:test` = 18 GRPO steps of 16
prompts x 8 samples, lr 3e-4, one worker, 64 held-out prompts): held-out greedy exact match
0.000 at step 0 and 0.656 at step 18 on both backends (0.531, sampled 0.160 -> 0.217, before the
CPU decoding products went weight-first, which changes float rounding). With the
advantages negated it stays 0.000 (sampled 0.160 -> 0.014).
"""

import os

import _rl
import pytest

from meltemi import fray
from meltemi.fray.ray import RayCluster
from meltemi.levanter.config import load_config, resolve, rl_spec
from meltemi.levanter.rl import RLTrainer
from meltemi.levanter.tracking import read_metrics

RISE = 0.3  # measured 0.000 -> 0.656; the flip of the format happens at steps 10-14
STEPS = 18


def _run(sft, run_dir, cluster):
    pairs = [("run_dir", str(run_dir)), ("checkpoint.init_from", str(sft))]
    loaded = load_config(f"{_rl.CONFIG}:test", pairs)
    pids = []
    result = RLTrainer(resolve(loaded), rl_spec(loaded.config), cluster=cluster,
                       on_step=lambda step, pool: pids.extend(pool.pids())).run()  # fmt: skip
    return result.evals, read_metrics(run_dir / "metrics.jsonl"), pids


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One SFT model; the same `:test` RL run on the in-process backend and on Ray."""
    sft = _rl.sft(tmp_path_factory.mktemp("sft"))
    with fray.InProcessCluster() as cluster:
        local = _run(sft, tmp_path_factory.mktemp("inprocess"), cluster)
    with RayCluster(num_cpus=2, configure_logging=False) as cluster:
        ray = _run(sft, tmp_path_factory.mktemp("ray"), cluster)
    return {"inprocess": local, "ray": ray}


@pytest.mark.parametrize("backend", ["inprocess", "ray"])
def test_grpo_raises_held_out_greedy_exact_match(runs, backend):
    """Held-out prompts are never trained on; their greedy reward rises by RISE or more."""
    evals, _, _ = runs[backend]
    start, end = evals[0]["reward"], evals[max(evals)]["reward"]
    print(f"{backend}: held-out greedy exact match {start:.3f} -> {end:.3f}")
    assert max(evals) == STEPS
    assert end >= start + RISE, (start, end)


def test_ray_runs_the_workers_as_actors_with_the_local_results(runs):
    """The same code on Ray: workers in their own processes, the same prompts, rewards, losses
    and held-out evaluations as in process for the same seeds."""
    local_evals, local_records, _ = runs["inprocess"]
    ray_evals, ray_records, pids = runs["ray"]
    assert pids and all(pid != os.getpid() for pid in pids)
    assert [r["step"] for r in ray_records if "train/loss" in r] == list(range(1, STEPS + 1))
    pairs = [(a, b) for a, b in zip(local_records, ray_records, strict=True) if "train/loss" in a]
    for a, b in pairs:
        assert a["rl/prompts"] == b["rl/prompts"]
        assert a["rl/arithmetic/reward_mean"] == b["rl/arithmetic/reward_mean"]
        assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-5)
    assert ray_evals.keys() == local_evals.keys()
    for step in ray_evals:
        assert ray_evals[step] == pytest.approx(local_evals[step], abs=1e-6)
