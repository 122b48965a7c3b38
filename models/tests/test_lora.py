"""LoRA adapters: identity at init, merge/unmerge, config errors, PEFT export loaded by `peft`.

Models are tiny and random, built locally (never downloaded).
"""

import json

import equinox as eqx
import hf_harness as H
import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import optax
import peft
import pytest
import torch

import meltemi.models as mm
from meltemi.models import hf, lora

TOKENS = (np.arange(3 * 13).reshape(3, 13) * 7 + 2) % 67  # batch 3, seq 13, vocab 67


@eqx.filter_jit
def _logits(model, tokens):
    return model(tokens).array


def _random_b(model, key):
    """The adapters' B set to random values (as after training), A unchanged."""

    def set_b(path, x):
        if "lora_b" in jax.tree_util.keystr(path) and eqx.is_array(x):
            return 0.2 * jax.random.normal(jax.random.fold_in(key, x.size), x.shape, x.dtype)
        return x

    return jax.tree_util.tree_map_with_path(set_b, model)


@pytest.fixture(scope="module")
def base():
    # Random weights loaded, not `mm.init`: no initialiser to compile, and norms are not ones.
    return T.random_model(mm.get_preset("tiny-llama"), seed=0)


def test_wrapped_model_equals_base_at_init(base):
    wrapped = lora.apply(base, lora.LoraConfig(rank=4, targets="all-linear"), key=jax.random.key(1))
    np.testing.assert_array_equal(_logits(wrapped, TOKENS), _logits(base, TOKENS))
    # ... and B is what makes it equal: A is not zero.
    a = wrapped.blocks.stacked.attn.q_proj.lora_a.array
    assert float(jnp.abs(a).max()) > 0


def test_targets_choose_the_wrapped_modules(base):
    wrapped = lora.apply(
        base, lora.LoraConfig(rank=2, targets=("q_proj", "mlp")), key=jax.random.key(1)
    )
    block = wrapped.blocks.stacked
    kinds = {
        n: type(getattr(m, n)).__name__
        for m, names in ((block.attn, lora._ATTN), (block.mlp, lora._MLP))
        for n in names
    }
    assert kinds == {
        "q_proj": "LoraLinear",
        "k_proj": "Linear",
        "v_proj": "Linear",
        "o_proj": "Linear",
        "gate_proj": "LoraLinear",
        "up_proj": "LoraLinear",
        "down_proj": "LoraLinear",
    }
    assert wrapped.lm_head is None or type(wrapped.lm_head).__name__ == "Linear"


def test_adapter_axes_follow_the_layer_axes(base):
    wrapped = lora.apply(base, lora.LoraConfig(rank=3, targets=("o_proj",)), key=jax.random.key(1))
    o = wrapped.blocks.stacked.attn.o_proj
    cfg = base.config
    assert [a.name for a in o.lora_a.axes] == ["layers", "lora_rank", *[a.name for a in o.In]]
    assert o.lora_b.shape == {"layers": cfg.num_layers, "embed": cfg.hidden_dim, "lora_rank": 3}


def test_merge_equals_wrapped_model_and_unmerge_restores_base(base):
    wrapped = lora.apply(base, lora.LoraConfig(rank=4, targets="all-linear"), key=jax.random.key(1))
    trained = _random_b(wrapped, jax.random.key(2))
    merged = lora.merge(trained)
    assert not lora.is_lora(merged)
    # The adapters change the output, and the merged weights reproduce that change.
    assert np.abs(_logits(trained, TOKENS) - _logits(base, TOKENS)).max() > 1e-2
    np.testing.assert_allclose(_logits(merged, TOKENS), _logits(trained, TOKENS), atol=1e-5)
    # Independent check of one merged weight: W + alpha/r * B @ A in plain numpy, layer 1.
    q = trained.blocks.stacked.attn.q_proj
    b = np.asarray(q.lora_b.rearrange(("layers", ..., "lora_rank")).array)[1]
    a = np.asarray(q.lora_a.rearrange(("layers", "lora_rank", ...)).array)[1]
    w = np.asarray(base.blocks.stacked.attn.q_proj.weight.array)[1]
    expect = w + (16.0 / 4) * np.einsum("...r,re->...e", b, a)
    got = np.asarray(merged.blocks.stacked.attn.q_proj.weight.array)[1]
    np.testing.assert_allclose(got, expect, atol=1e-6)
    back = lora.unmerge(merged, trained)
    np.testing.assert_allclose(
        back.blocks.stacked.mlp.down_proj.base.weight.array,
        base.blocks.stacked.mlp.down_proj.weight.array,
        atol=1e-6,
    )
    np.testing.assert_array_equal(
        back.blocks.stacked.mlp.down_proj.lora_b.array,
        trained.blocks.stacked.mlp.down_proj.lora_b.array,
    )


def test_merge_with_zero_b_is_bit_exact(base):
    wrapped = lora.apply(base, lora.LoraConfig(rank=4, targets="all-linear"), key=jax.random.key(1))
    merged = lora.merge(wrapped)
    for x, y in zip(jax.tree.leaves(merged), jax.tree.leaves(base), strict=True):
        np.testing.assert_array_equal(x, y)


def test_unrolled_model_gets_per_layer_adapters():
    # Two layers are enough for a list of blocks that each get their own adapters.
    cfg = mm.get_preset("tiny-llama").replace(scan_layers=False, num_layers=2)
    model = T.random_model(cfg, seed=0)
    wrapped = _random_b(
        lora.apply(model, lora.LoraConfig(rank=2), key=jax.random.key(1)), jax.random.key(2)
    )
    assert wrapped.blocks.blocks[0].attn.v_proj.lora_b.shape["lora_rank"] == 2
    np.testing.assert_allclose(
        _logits(lora.merge(wrapped), TOKENS), _logits(wrapped, TOKENS), atol=1e-5
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rank": -1}, r"LoraConfig.rank=-1: must be an int >= 0"),
        ({"rank": 4, "alpha": 0}, r"LoraConfig.alpha=0: must be a number > 0"),
        ({"rank": 4, "dropout": 1.0}, r"LoraConfig.dropout=1.0: must be in \[0, 1\)"),
        ({"rank": 4, "targets": ("q_prj",)}, r"unknown module 'q_prj'; choose from"),
        ({"rank": 4, "targets": "qkv"}, r"a string must be 'all-linear' or one module from"),
    ],
)
def test_config_errors_name_field_and_value(kwargs, match):
    with pytest.raises(mm.ConfigError, match=match):
        lora.LoraConfig(**kwargs)


def test_moe_mlp_targets_are_refused():
    cfg = mm.get_preset("tiny-mixtral")
    with pytest.raises(mm.ConfigError, match=r"mixture-of-experts model has no 'up_proj'"):
        lora.resolve_targets(cfg, lora.LoraConfig(rank=2, targets=("up_proj",)))
    assert lora.resolve_targets(cfg, lora.LoraConfig(rank=2, targets="all-linear")) == lora._ATTN


def test_optimizer_keeps_state_for_adapters_only(base):
    wrapped = lora.apply(base, lora.LoraConfig(rank=4), key=jax.random.key(1))
    params = eqx.filter(wrapped, eqx.is_array)
    state = lora.optimizer(optax.adamw(1e-2)).init(params)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state) if x.ndim > 0)
    full_bytes = sum(x.nbytes for x in jax.tree.leaves(optax.adamw(1e-2).init(params)))
    assert state_bytes == 2 * lora.adapter_bytes(params)  # adam's mu and nu
    assert state_bytes < full_bytes / 5


def test_training_changes_adapters_only(base):
    wrapped = lora.apply(base, lora.LoraConfig(rank=4, dropout=0.1), key=jax.random.key(1))
    params, static = eqx.partition(wrapped, eqx.is_array)
    tx = lora.optimizer(optax.adamw(1e-2, weight_decay=0.1))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, key):
        def loss(p):
            model = lora.with_dropout_key(lora.freeze(eqx.combine(p, static)), key)
            return model.loss(TOKENS)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    new = params
    for i in range(3):
        new, opt_state, _ = step(new, opt_state, jax.random.key(i))
    mask = lora.trainable_mask(params)
    for old, now, train in zip(
        jax.tree.leaves(params), jax.tree.leaves(new), jax.tree.leaves(mask), strict=True
    ):
        if train:
            continue
        np.testing.assert_array_equal(
            np.asarray(old).view(np.uint8), np.asarray(now).view(np.uint8)
        )
    b = new.blocks.stacked.attn.q_proj.lora_b.array
    assert float(jnp.abs(b).max()) > 0


def test_dropout_applies_only_with_a_key(base):
    wrapped = _random_b(
        lora.apply(base, lora.LoraConfig(rank=4, dropout=0.5), key=jax.random.key(1)),
        jax.random.key(2),
    )
    plain = _logits(wrapped, TOKENS)
    np.testing.assert_allclose(plain, _logits(lora.merge(wrapped), TOKENS), atol=1e-5)
    dropped = _logits(lora.with_dropout_key(wrapped, jax.random.key(3)), TOKENS)
    assert np.abs(dropped - plain).max() > 1e-3


# -- PEFT -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    torch_model = H.random_hf_model("tiny-llama")
    directory = H.save_hf(torch_model, tmp_path_factory.mktemp("base"))
    model, _ = hf.load(directory)
    return directory, model


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), "all-linear"])
def test_peft_loads_adapter_onto_transformers_model(hf_pair, tmp_path, targets):
    directory, model = hf_pair
    cfg = lora.LoraConfig(rank=4, alpha=8.0, targets=targets)
    trained = _random_b(lora.apply(model, cfg, key=jax.random.key(1)), jax.random.key(2))
    files = lora.save_peft(trained, tmp_path / "adapter", base_model_name_or_path=str(directory))
    assert files == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)

    torch_base = H.load_hf(directory)
    reference = H.hf_logits(torch_base, TOKENS)
    peft_model = peft.PeftModel.from_pretrained(torch_base, str(tmp_path / "adapter")).eval()
    ours = _logits(trained, TOKENS)
    assert np.abs(ours - reference).max() > 1e-2  # the adapters matter
    np.testing.assert_allclose(H.hf_logits(peft_model, TOKENS), ours, atol=1e-4)
    # peft's own merge agrees with ours.
    merged = peft_model.merge_and_unload()
    np.testing.assert_allclose(
        H.hf_logits(merged, TOKENS), _logits(lora.merge(trained), TOKENS), atol=1e-4
    )


def test_merged_hf_export_loads_in_transformers(hf_pair, tmp_path):
    directory, model = hf_pair
    trained = _random_b(
        lora.apply(model, lora.LoraConfig(rank=4), key=jax.random.key(1)), jax.random.key(2)
    )
    hf.save(lora.merge(trained), None, tmp_path / "merged")
    with torch.no_grad():
        got = H.hf_logits(H.load_hf(tmp_path / "merged"), TOKENS)
    np.testing.assert_allclose(got, _logits(trained, TOKENS), atol=1e-4)


def test_hf_save_of_unmerged_model_names_the_fix(hf_pair, tmp_path):
    _, model = hf_pair
    wrapped = lora.apply(model, lora.LoraConfig(rank=2), key=jax.random.key(1))
    with pytest.raises(hf.CheckpointError, match=r"lora.merge\(model\)"):
        hf.save(wrapped, None, tmp_path / "x")


def test_gpt2_peft_export_is_refused_with_the_fix(tmp_path):
    model = T.random_model(mm.get_preset("tiny-gpt2"), seed=0)
    wrapped = lora.apply(model, lora.LoraConfig(rank=2), key=jax.random.key(1))
    with pytest.raises(mm.ConfigError, match=r"export the merged model instead"):
        lora.save_peft(wrapped, tmp_path)


def test_one_module_name_may_be_given_as_a_string():
    assert lora.LoraConfig(rank=2, targets="v_proj").targets == ("v_proj",)
    assert lora.LoraConfig(rank=2, targets=["q_proj", "attn"]).targets == ("q_proj", "attn")
