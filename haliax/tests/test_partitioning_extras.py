"""Haliax's partitioning names on 8 fake CPU devices: shard_map by name, fsdp, auto_sharded,
shard_with_axis_mapping, round_axis_for_partitioning, ResourceAxis, set_mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import meltemi.haliax as hax
from meltemi.haliax import partitioning as P

Batch, Embed, Mlp = hax.make_axes(batch=8, embed=12, mlp=7)


def _mesh(**shape):
    return P.make_mesh(shape)


def test_shard_map_gives_per_device_axes_inside_and_global_axes_outside():
    mesh = _mesh(data=4, model=2)
    x = hax.random.normal(jax.random.key(0), (Batch, Embed))
    seen = {}

    @hax.shard_map(mesh=mesh, axis_mapping={"batch": "data", "embed": "model"})
    def local_sum(x):
        seen["shape"] = x.shape
        per_row = jax.lax.psum(hax.sum(x, "embed").array, "model")
        return hax.named(per_row, x.axes[:1]), jax.lax.psum(hax.sum(x).array, ("data", "model"))

    per_row, total = local_sum(x)
    assert seen["shape"] == {"batch": 2, "embed": 6}
    assert per_row.axes == (Batch,)
    np.testing.assert_allclose(total, np.asarray(x.array).sum(), rtol=1e-5)


def test_shard_map_with_a_psum_matches_the_unsharded_matmul():
    mesh = _mesh(data=8)
    x = hax.random.normal(jax.random.key(1), (Batch, Embed))
    w = hax.random.normal(jax.random.key(2), (Embed, Mlp))

    def matmul(x, w):
        return hax.dot(x, w, axis="embed")

    f = hax.shard_map(matmul, mesh=mesh, axis_mapping={"batch": "data"})
    out = f(x, w)
    assert out.axes == (Batch, Mlp)
    np.testing.assert_allclose(out.array, np.asarray(x.array) @ np.asarray(w.array), rtol=1e-5)


def test_shard_map_under_the_ambient_mapping_and_mesh_and_explicit_specs():
    mesh = _mesh(data=8)
    x = hax.arange(Batch).astype(jnp.float32)
    with hax.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        doubled = hax.shard_map(lambda x: x * 2)(x)
        np.testing.assert_array_equal(doubled.array, np.arange(8) * 2)
        summed = hax.shard_map(
            lambda x: jax.lax.psum(hax.sum(x).array, "data"),
            in_specs=(PartitionSpec("data"),),
            out_specs=PartitionSpec(),
        )(x)
    assert float(summed[0] if summed.ndim else summed) == 28.0


def test_shard_map_without_a_mesh_says_how_to_give_one():
    with pytest.raises(P.ShardingError, match="jax.set_mesh"):
        hax.shard_map(lambda x: x)(hax.ones(Batch))


def test_fsdp_keeps_parameters_sharded_and_matches_one_device():
    mesh = _mesh(data=8)
    E16 = Embed.resize(16)
    lin = hax.nn.Linear.init(E16, Mlp.resize(8), key=jax.random.key(3))
    x = hax.random.normal(jax.random.key(4), (Batch, E16))

    @hax.fsdp({"embed": "data", "mlp": "data"}, {"batch": "data"})
    def step(lin, x):
        return lin(x), lin

    with hax.set_mesh(mesh):
        y, lin_out = step(lin, x)
    np.testing.assert_allclose(y.array, lin(x).array, rtol=1e-5, atol=1e-5)
    assert lin_out.weight.array.sharding.spec == PartitionSpec("data", None)
    plain = hax.fsdp(lambda m, x: m(x), {"embed": "data"}, {"batch": "data"})
    with hax.set_mesh(mesh):
        np.testing.assert_allclose(plain(lin, x).array, y.array, rtol=1e-5, atol=1e-5)


def test_auto_sharded_uses_the_ambient_mapping_or_does_nothing():
    mesh = _mesh(data=8)
    x = hax.ones((Batch, Embed))
    with hax.set_mesh(mesh):
        assert hax.auto_sharded(x) is x
        with hax.axis_mapping({"batch": "data"}):
            y = hax.auto_sharded(x)
        z = hax.shard_with_axis_mapping(
            hax.ones((Batch, Embed.resize(16))), {"embed": "data"}, mesh
        )
    assert y.array.sharding.spec == PartitionSpec("data", None)
    assert z.array.sharding.spec == PartitionSpec(None, "data")


def test_round_axis_for_partitioning_rounds_up_to_the_shard_count():
    with hax.set_mesh(_mesh(data=4, model=2)):
        assert P.round_axis_for_partitioning(hax.Axis("vocab", 11), {"vocab": "data"}).size == 12
        assert (
            P.round_axis_for_partitioning(hax.Axis("vocab", 11), {"vocab": ("data", "model")}).size
            == 16
        )
        assert P.round_axis_for_partitioning(Mlp, {}).size == 7


def test_resource_axis_names_are_plain_strings():
    assert P.ResourceAxis.DATA == "data" and P.ResourceAxis.MODEL == "model"
    mesh = _mesh(**{P.ResourceAxis.DATA: 8})
    assert mesh.shape == {"data": 8}
