import equinox as eqx
import jax
import numpy as np
import pytest

import meltemi.haliax as hax

Layers, Batch, Embed, Mlp = (
    hax.Axis("layers", 3),
    hax.Axis("batch", 5),
    hax.Axis("embed", 7),
    hax.Axis("mlp", 11),
)


class Block(eqx.Module):
    norm: hax.nn.RmsNorm
    mlp: hax.nn.MLP

    @staticmethod
    def init(Embed, Mlp, *, key):
        return Block(
            hax.nn.RmsNorm.init(Embed),
            hax.nn.MLP.init(Embed, Embed, Mlp, 1, hax.nn.silu, key=key, gated=True),
        )

    def __call__(self, x, scale=None, *, key=None):
        y = self.mlp(self.norm(x))
        if scale is not None:
            y = y * scale
        return x + y


def _stack(policy=False):
    return hax.nn.Stacked.init(Layers, Block, gradient_checkpointing=policy)(
        Embed, Mlp, key=jax.random.split(jax.random.key(0), 3)
    )


def _loss(stack, x):
    return hax.sum(stack.fold(x) ** 2).scalar()


def test_stacked_init_puts_layers_axis_first():
    s = _stack()
    assert s.stacked.mlp.layers[0].weight.axes == (Layers, Mlp, Embed)
    assert s.stacked.norm.weight.axes == (Layers, Embed)


def test_stacked_fold_equals_python_loop_over_layers():
    s = _stack()
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    ref = x
    for layer in s.unstacked():
        ref = layer(ref)
    np.testing.assert_allclose(s.fold(x).array, ref.array, rtol=1e-5, atol=1e-5)


def test_stacked_fold_passes_unscanned_named_args_to_every_layer():
    s = _stack()
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    scale = hax.full(Embed, 0.5)
    ref = x
    for layer in s.unstacked():
        ref = layer(ref, scale)
    np.testing.assert_allclose(s.fold(x, scale).array, ref.array, rtol=1e-5, atol=1e-5)


class ScanBlock(eqx.Module):
    inner: Block

    @staticmethod
    def init(Embed, Mlp, *, key):
        return ScanBlock(Block.init(Embed, Mlp, key=key))

    def __call__(self, x):
        y = self.inner(x)
        return y, hax.sum(y)


def test_stacked_scan_returns_per_layer_outputs():
    s = hax.nn.Stacked.init(Layers, ScanBlock)(
        Embed, Mlp, key=jax.random.split(jax.random.key(0), 3)
    )
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    carry, ys = s.scan(x)
    assert ys.axes == (Layers,)
    ref = x
    for i, layer in enumerate(s.unstacked()):
        ref, y = layer(ref)
        np.testing.assert_allclose(ys.array[i], y.scalar(), rtol=1e-5)
    np.testing.assert_allclose(carry.array, ref.array, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", [False, True, "full", "offload"])
def test_remat_policies_give_identical_gradients(policy):
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    ref = eqx.filter_grad(_loss)(_stack(False), x)
    g = eqx.filter_jit(eqx.filter_grad(_loss))(_stack(policy), x)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(g)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_remat_policy_inserts_checkpoint_in_jaxpr():
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    jaxpr_none = str(jax.make_jaxpr(eqx.filter_grad(_loss))(_stack(False), x))
    jaxpr_full = str(jax.make_jaxpr(eqx.filter_grad(_loss))(_stack(True), x))
    assert "remat" not in jaxpr_none and "checkpoint" not in jaxpr_none
    assert "remat" in jaxpr_full or "checkpoint" in jaxpr_full


def test_offload_policy_keeps_carries_in_host_memory():
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    offload = str(jax.make_jaxpr(eqx.filter_grad(_loss))(_stack("offload"), x))
    plain = str(jax.make_jaxpr(eqx.filter_grad(_loss))(_stack(True), x))
    assert "f32<host>[5,7]" in offload  # one (batch, embed) carry per layer, on the host
    assert "<host>" not in plain


def test_offload_falls_back_with_warning_without_pinned_host(monkeypatch):
    from meltemi.haliax import _remat

    monkeypatch.setattr(_remat, "offload_supported", lambda: False)
    with pytest.warns(UserWarning, match=r"lacks; using 'save_carries' instead"):
        policy = hax.ScanCheckpointPolicy("offload").resolved()
    assert policy.kind == "save_carries"


def test_unknown_remat_policy_is_an_error():
    with pytest.raises(ValueError, match=r"kind='sometimes' is not one of"):
        _stack("sometimes")


def test_blockseq_matches_stacked():
    s = _stack()
    seq = hax.nn.BlockSeq(s.unstacked(), Layers, s.gradient_checkpointing)
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    np.testing.assert_allclose(seq.fold(x).array, s.fold(x).array, rtol=1e-5, atol=1e-5)


def test_blockseq_init_builds_distinct_layers():
    seq = hax.nn.BlockSeq.init(Layers, Block)(
        Embed, Mlp, key=jax.random.split(jax.random.key(0), 3)
    )
    w = [b.mlp.layers[0].weight.array for b in seq.blocks]
    assert not np.allclose(w[0], w[1])


def test_from_layers_inverts_unstacked():
    s = _stack()
    s2 = hax.nn.Stacked.from_layers(Layers, s.unstacked())
    for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(s2)):
        np.testing.assert_array_equal(a, b)


def test_stacked_keys_per_layer_are_scanned():
    s = _stack()
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    keys = jax.random.split(jax.random.key(2), Layers.size)

    class Noisy(eqx.Module):
        inner: Block

        def __call__(self, x, *, key):
            return self.inner(x) + hax.random.normal(key, x.axes)

    out = hax.fold(lambda c, blk, key: Noisy(blk)(c, key=key), Layers)(x, s.stacked, keys)
    # Reference: a Python loop giving layer i the key keys[i], with plain jax.random noise.
    ref = x.array
    for i, layer in enumerate(s.unstacked()):
        ref = layer(hax.named(ref, x.axes)).array + jax.random.normal(keys[i], ref.shape)
    np.testing.assert_allclose(out.array, ref, rtol=1e-5, atol=1e-5)
    # The noise matters: one key for every layer gives a different result.
    same = hax.fold(lambda c, blk, key: Noisy(blk)(c, key=keys[0]), Layers)(x, s.stacked, keys)
    assert not np.allclose(same.array, ref, atol=1e-3)
