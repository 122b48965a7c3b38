"""The sweep's config checks, its model ladder and its FLOP accounting (nothing is trained)."""

import math
import pathlib

import jax
import pytest

import meltemi.models as mm
from meltemi.levanter.config import ConfigError, load_config
from meltemi.levanter.experiments import Ladder, SweepConfigError, sweep_section, sweep_spec

CONFIG = pathlib.Path(__file__).parent.parent / "configs" / "isoflop.py"


def _ladder(variant="", *overrides):
    resolved = load_config(f"{CONFIG}{variant}", list(overrides))
    return Ladder(resolved, sweep_spec(resolved.config.sweep))


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("budgets", (1e11,), r"sweep.budgets=\(100000000000.0,\): a fit needs at least 2 budgets"),
        ("budgets", (1e11, -1.0), r"every entry must be one of positive numbers \(got -1.0\)"),
        ("sizes_per_budget", 2, r"sweep.sizes_per_budget=2: must be an integer >= 3"),
        ("sizes_per_budget", 12, r"sweep.sizes_per_budget=12: only 10 widths in sweep.widths"),
        ("widths", (32, 40, 64, 96), r"sweep.widths=\(32, 40, 64, 96\): \[40\] are not multiples"),
        ("metric", "ppl", r"sweep.metric='ppl': must be one of \('loss', 'bpb'\)"),
        ("experts_per_token", 5, r"sweep.experts_per_token=5: exceeds sweep.num_experts=4"),
        ("confidence", 95.0, r"sweep.confidence=95.0: must be in \(0, 1\), e.g. 0.95"),
    ],
)
def test_a_bad_sweep_value_names_the_key_the_value_and_the_fix(key, value, message):
    section = sweep_section()
    section[key] = value
    with pytest.raises(SweepConfigError, match=message):
        sweep_spec(section)


def test_default_sweep_spans_the_goal():
    sweep = sweep_spec(load_config(str(CONFIG)).config.sweep)
    assert math.log10(max(sweep.budgets) / min(sweep.budgets)) >= 1.5
    assert sweep.sizes_per_budget >= 4 and sweep.family == "dense"


def test_every_run_spends_its_budget_up_to_one_step():
    ladder = _ladder()
    runs = ladder.isoflop_runs()
    for budget in ladder.sweep.budgets:
        mine = [r for r in runs if r.budget == budget]
        assert len(mine) == ladder.sweep.sizes_per_budget
        assert len({r.batch_size for r in mine}) == 1  # one batch size per budget
        for r in mine:
            one_step = r.flops_per_token * r.batch_size * r.seq_len
            assert abs(r.flops - budget) <= one_step / 2
            assert r.flops == pytest.approx(r.flops_per_token * r.steps * r.batch_size * r.seq_len)


def test_each_budget_is_centred_on_its_guess():
    ladder = _ladder()
    for budget in ladder.sweep.budgets:
        ns = sorted(r.n_params for r in ladder.isoflop_runs() if r.budget == budget)
        guess = math.sqrt(budget / (6 * ladder.sweep.tokens_per_param))
        inside = ns[0] <= guess <= ns[-1]
        at_end = ns[0] == ladder.n_params(ladder.shapes[0]) or ns[-1] == ladder.n_params(
            ladder.shapes[-1]
        )
        assert inside or at_end, (budget, ns, guess)


def test_parameter_counts_match_the_real_model():
    # N of 6N is every parameter but the input embedding (the head is a matmul): count the
    # initialised model's arrays independently of meltemi.models' analytic counts.
    ladder = _ladder()
    for shape in ladder.shapes[:4]:
        cfg = ladder.model(shape)
        model = jax.eval_shape(lambda cfg=cfg: mm.Transformer.init(cfg, key=jax.random.key(0)))
        total = sum(math.prod(x.shape) for x in jax.tree.leaves(model))
        run = ladder.plan("isoflop", 1e12, shape)
        assert run.params == total
        embed = cfg.vocab_size * cfg.hidden_dim
        assert run.n_params == total - (0 if cfg.tie_embeddings else embed)
        assert (cfg.hidden_dim, cfg.num_layers, cfg.num_heads) == (
            shape.width,
            shape.layers,
            shape.width // 16,
        )


def test_attention_flops_are_counted_on_top_of_6n():
    ladder = _ladder()
    shape = ladder.shapes[2]
    run = ladder.plan("isoflop", 1e12, shape)
    attention = 12 * run.seq_len * shape.heads * shape.head_dim * shape.layers
    assert run.flops_per_token == 6 * run.n_params + attention


def test_batch_sweep_varies_only_the_batch_size():
    ladder = _ladder(":micro")
    runs = ladder.batch_runs()
    assert [r.batch_size for r in runs] == list(ladder.sweep.batch_sizes)
    assert len({r.shape for r in runs}) == 1 and len({r.name for r in runs}) == len(runs)
    assert all(abs(r.flops / r.budget - 1) < 0.05 for r in runs)


def test_an_moe_sweep_needs_an_moe_preset():
    with pytest.raises(ConfigError, match="preset 'tiny-llama' has no experts; use an MoE preset"):
        _ladder("", ("sweep.family", "moe"))


def test_an_moe_ladder_counts_active_experts():
    ladder = _ladder("", ("sweep.family", "moe"), ("model.preset", "tiny-mixtral"))
    shape = ladder.shapes[0]
    cfg = ladder.model(shape)
    assert (cfg.moe.num_experts, cfg.moe.top_k) == (4, 2)
    run = ladder.plan("isoflop", 1e11, shape)
    assert run.n_params < run.params  # 2 of 4 experts active per token
    assert run.n_params == mm.param_count(cfg, active=True, embeddings=False) + (
        cfg.vocab_size * cfg.hidden_dim
    )
