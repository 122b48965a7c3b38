import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
from meltemi.haliax import partitioning as P  # noqa: E402
from meltemi.haliax.nn import attention as A  # noqa: E402

Batch, Pos, Embed, Mlp, Vocab = (
    hax.Axis("batch", 8),
    hax.Axis("pos", 5),
    hax.Axis("embed", 8),
    hax.Axis("mlp", 12),
    hax.Axis("vocab", 11),
)
Layers = hax.Axis("layers", 2)


class Block(eqx.Module):
    attn_norm: hax.nn.RmsNorm
    attn: A.Attention
    mlp_norm: hax.nn.RmsNorm
    mlp: hax.nn.MLP

    @staticmethod
    def init(*, key):
        k1, k2 = jax.random.split(key)
        attn = A.Attention.init(
            Embed, num_heads=4, num_kv_heads=2, head_size=2, key=k1, rotary=hax.nn.RotaryConfig()
        )
        mlp = hax.nn.MLP.init(Embed, Embed, Mlp, 1, hax.nn.silu, key=k2, gated=True, use_bias=False)
        return Block(hax.nn.RmsNorm.init(Embed), attn, hax.nn.RmsNorm.init(Embed), mlp)

    def __call__(self, x, mask):
        x = hax.shard(x)
        x = x + self.attn(self.attn_norm(x), mask)
        return x + self.mlp(self.mlp_norm(x))


class Tiny(eqx.Module):
    embed: hax.nn.Embedding
    layers: hax.nn.Stacked
    norm: hax.nn.RmsNorm

    @staticmethod
    def init(*, key):
        k1, k2 = jax.random.split(key)
        layers = hax.nn.Stacked.init(Layers, Block, gradient_checkpointing=True)(
            key=jax.random.split(k2, Layers.size)
        )
        return Tiny(hax.nn.Embedding.init(Vocab, Embed, key=k1), layers, hax.nn.RmsNorm.init(Embed))


def loss_fn(model, ids):
    x = model.embed.embed(ids)
    x = model.layers.fold(x, A.AttentionMask.causal())
    logits = model.embed.unembed(model.norm(x))
    targets = hax.roll(ids, -1, Pos)
    return hax.nn.cross_entropy_loss(logits, Vocab, targets, z_loss_weight=1e-3).scalar()


def step(model, ids):
    return eqx.filter_value_and_grad(loss_fn)(model, ids)


@pytest.fixture(scope="module")
def setup():
    assert jax.device_count() == 8, "needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
    model = eqx.filter_jit(Tiny.init)(key=jax.random.key(0))
    ids = hax.random.randint(jax.random.key(1), (Batch, Pos), 0, Vocab.size)
    single = jax.devices()[0]
    ref_loss, ref_grad = eqx.filter_jit(step)(*jax.device_put((model, ids), single))
    return model, ids, ref_loss, ref_grad


STRATEGIES = {
    "fsdp8": ({"data": 8}, {"batch": "data", "embed": "data"}),
    "fsdp4_tp2": (
        {"data": 4, "model": 2},
        {"batch": "data", "embed": "data", "mlp": "model", "kv_heads": "model"},
    ),
    "dp2_fsdp4": ({"replica": 2, "data": 4}, {"batch": ("replica", "data"), "embed": "data"}),
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_sharded_step_matches_single_device(setup, name):
    model, ids, ref_loss, ref_grad = setup
    mesh_shape, mapping = STRATEGIES[name]
    mesh = P.make_mesh(mesh_shape)
    with jax.set_mesh(mesh):
        sharded_model = hax.shard(model, mapping)
        f = hax.named_jit(step, axis_resources=mapping)
        loss, grad = f(sharded_model, ids)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # the gradients really are sharded the way the mapping says
    emb = grad.embed.weight.array.sharding
    assert isinstance(emb, NamedSharding) and emb.spec == PartitionSpec(None, "data")
    if "model" in mesh_shape:
        up = grad.layers.stacked.mlp.layers[0].weight
        assert up.array.sharding.spec == P.pspec_for_axis(up.axes, mapping, mesh)
        assert up.array.sharding.spec == PartitionSpec(None, "model", "data")


def test_named_jit_does_not_recompile_second_call(setup):
    model, ids, _, _ = setup
    mapping = STRATEGIES["fsdp8"][1]
    mesh = P.make_mesh({"data": 8})
    with jax.set_mesh(mesh):
        f = hax.named_jit(lambda m, i: loss_fn(m, i), axis_resources=mapping)
        m = hax.shard(model, mapping)
        f(m, ids)
        with jax.log_compiles():
            with jax.no_tracing():
                f(m, ids)


def test_pspec_uses_each_mesh_axis_once():
    mesh = P.make_mesh({"data": 4, "model": 2})
    spec = P.pspec_for_axis((Batch, Embed, Mlp), {"batch": "data", "embed": "data"}, mesh)
    assert spec == PartitionSpec("data", None, None)  # embed: data already taken by batch


def test_uneven_axis_is_an_error_naming_axis_size_mesh_axis_and_fix():
    mesh = P.make_mesh({"data": 4, "model": 2})
    with pytest.raises(
        P.ShardingError,
        match=r"axis 'vocab' of size 11 cannot be split evenly over mesh axis 'model'=2 .*"
        r"pad it to 12.*\{'vocab': None, \.\.\.\}.*uneven=\"replicate\"",
    ):
        P.pspec_for_axis((Batch, Vocab), {"batch": "data", "vocab": "model"}, mesh)
    with pytest.raises(P.ShardingError, match=r"'vocab' of size 11 .* 'data'=4, 'model'=2"):
        P.pspec_for_axis((Vocab,), {"vocab": ("data", "model")}, mesh)


def test_uneven_axis_is_an_error_in_shard_and_infer_resource_partitions():
    mesh = P.make_mesh({"data": 8})
    x = hax.ones((Vocab, Embed))
    with pytest.raises(P.ShardingError, match=r"axis 'vocab' of size 11"):
        hax.shard(x, {"vocab": "data"}, mesh)
    with pytest.raises(P.ShardingError, match=r"axis 'vocab' of size 11"):
        P.infer_resource_partitions({"w": x}, {"vocab": "data"}, mesh=mesh)


def test_uneven_replicate_keeps_the_axis_whole_when_asked():
    mesh = P.make_mesh({"data": 8})
    x = hax.ones((Vocab, Embed))
    assert P.pspec_for_axis(x.axes, {"vocab": "data"}, mesh, uneven="replicate") == (
        PartitionSpec(None, None)
    )
    with (
        jax.set_mesh(mesh),
        hax.axis_mapping({"vocab": "data", "embed": "data"}, uneven="replicate"),
    ):
        y = hax.shard(x)
        z = jax.jit(lambda a: hax.shard(a * 2))(x)
    assert y.array.sharding.spec == PartitionSpec(None, "data")
    assert z.array.sharding.spec == PartitionSpec(None, "data")


def test_named_jit_uses_the_mapping_active_at_each_call():
    mesh = P.make_mesh({"data": 8})
    f = hax.named_jit(lambda x: x * 2)
    x = hax.ones((Batch, Embed))
    with jax.set_mesh(mesh):
        with hax.axis_mapping({"batch": "data"}):
            by_batch = f(x)
        with hax.axis_mapping({"embed": "data"}):
            by_embed = f(x)
        with hax.axis_mapping({"batch": "data"}):
            again = f(x)
    assert by_batch.array.sharding.spec == PartitionSpec("data", None)
    assert by_embed.array.sharding.spec == PartitionSpec(None, "data")
    assert again.array.sharding.spec == PartitionSpec("data", None)
    np.testing.assert_array_equal(by_embed.array, 2.0)


def test_named_jit_model_code_sees_the_mapping_of_each_call():
    mesh = P.make_mesh({"data": 8})

    def inner_layout(x):
        y = hax.shard(x + 1)  # model code: constrains by the ambient mapping
        return y, y.array.sum()

    f = hax.named_jit(inner_layout, out_axis_resources={})
    x = hax.ones((Batch, Embed))
    with jax.set_mesh(mesh):
        with hax.axis_mapping({"batch": "data"}):
            hlo_batch = f.lower(x).as_text()
        with hax.axis_mapping({"embed": "data"}):
            hlo_embed = f.lower(x).as_text()
    assert hlo_batch != hlo_embed


def test_mapping_to_unknown_mesh_axis_is_an_error():
    mesh = P.make_mesh({"data": 8})
    with pytest.raises(P.ShardingError, match=r"mesh axis 'model', but the mesh has axes"):
        P.pspec_for_axis((Mlp,), {"mlp": "model"}, mesh)


def test_shard_without_mesh_is_identity():
    x = hax.ones((Batch, Embed))
    assert hax.shard(x, {"batch": "data"}) is x


def test_axis_mapping_context_is_used_by_shard():
    mesh = P.make_mesh({"data": 8})
    with jax.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        y = hax.shard(hax.ones((Batch, Embed)))
    assert y.array.sharding.spec == PartitionSpec("data", None)


def test_infer_resource_partitions_gives_named_shardings():
    mesh = P.make_mesh({"data": 8})
    tree = {"w": hax.ones((Embed, Vocab)), "step": jnp.zeros(())}
    sh = P.infer_resource_partitions(tree, {"embed": "data"}, mesh=mesh)
    assert sh["w"].array.spec == PartitionSpec("data", None)
    assert sh["step"].spec == PartitionSpec()


def test_make_mesh_with_too_many_devices_says_how_to_fake_them():
    with pytest.raises(P.ShardingError, match=r"needs 16 devices but only 8.*device_count=16"):
        P.make_mesh({"data": 16})


def test_shard_inside_plain_jit_uses_set_mesh_and_axis_mapping():
    mesh = P.make_mesh({"data": 8})
    with jax.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        y = jax.jit(lambda x: hax.shard(x * 2))(hax.ones((Batch, Vocab)))
    assert y.array.sharding.spec == PartitionSpec("data")
    np.testing.assert_array_equal(y.array, 2.0)
