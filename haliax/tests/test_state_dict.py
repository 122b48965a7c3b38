import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax
from meltemi.haliax import state_dict as sdm

Layers, Embed, Mlp = hax.Axis("layers", 3), hax.Axis("embed", 5), hax.Axis("mlp", 7)
KV, Group, Head = (
    hax.Axis("kv_heads", 2),
    hax.Axis("q_heads_per_group", 3),
    hax.Axis("head_size", 4),
)


class Block(eqx.Module):
    norm: hax.nn.RmsNorm
    q: hax.nn.Linear

    @staticmethod
    def init(*, key):
        return Block(
            hax.nn.RmsNorm.init(Embed), hax.nn.Linear.init(Embed, (KV, Group, Head), key=key)
        )


class Model(eqx.Module):
    layers: hax.nn.Stacked
    out: hax.nn.Linear

    @staticmethod
    def init(*, key):
        k1, k2 = jax.random.split(key)
        layers = hax.nn.Stacked.init(Layers, Block)(key=jax.random.split(k1, 3))
        return Model(layers, hax.nn.Linear.init(Embed, Mlp, key=k2, use_bias=False))


@pytest.fixture(scope="module")
def model():
    return eqx.filter_jit(Model.init)(key=jax.random.key(0))


def test_state_dict_keys_follow_fields_and_drop_stacked(model):
    sd = sdm.to_state_dict(model)
    assert sorted(sd) == ["layers.norm.weight", "layers.q.bias", "layers.q.weight", "out.weight"]
    assert sd["layers.q.weight"].shape == (3, 2, 3, 4, 5)


def test_state_dict_roundtrip_is_exact(model):
    sd = sdm.to_state_dict(model)
    template = eqx.filter_eval_shape(Model.init, key=jax.random.key(1))
    back = sdm.from_state_dict(template, sd)
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b)


def test_torch_compatible_flattens_linear_and_unstacks_layers(model):
    sd = sdm.to_torch_compatible_state_dict(model, prefix="model")
    assert sd["model.layers.1.q.weight"].shape == (24, 5)
    assert sd["model.layers.1.q.bias"].shape == (24,)
    assert sd["model.out.weight"].shape == (7, 5)
    w = model.layers.stacked.q.weight.array[1]  # (kv, group, head, embed)
    np.testing.assert_array_equal(sd["model.layers.1.q.weight"], np.asarray(w).reshape(24, 5))


def test_torch_compatible_roundtrip_is_exact(model):
    sd = sdm.to_torch_compatible_state_dict(model, prefix="model")
    back = sdm.from_torch_compatible_state_dict(model, sd, prefix="model")
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b)


def test_unstack_then_stack_roundtrips(model):
    sd = sdm.to_state_dict(model)
    per_layer = sdm.unstack_state_dict(sd, "layers")
    assert "layers.2.norm.weight" in per_layer and "layers.norm.weight" not in per_layer
    again = sdm.stack_state_dict(per_layer, "layers")
    assert sorted(again) == sorted(sd)
    np.testing.assert_array_equal(again["layers.q.weight"], sd["layers.q.weight"])


def test_axis_order_hook_writes_positional_layout(model):
    def order(key, x):
        return [a.name for a in x.axes][::-1] if key == "out.weight" else None

    sd = sdm.to_state_dict(model, axis_order=order)
    assert sd["out.weight"].shape == (5, 7)
    back = sdm.from_state_dict(model, sd, axis_order=order)
    np.testing.assert_array_equal(back.out.weight.array, model.out.weight.array)


def test_missing_key_suggests_close_match(model):
    sd = sdm.to_state_dict(model)
    sd["out.weights"] = sd.pop("out.weight")
    with pytest.raises(
        sdm.StateDictError, match=r"no key 'out.weight'.*did you mean \['out.weights'\]"
    ):
        sdm.from_state_dict(model, sd, strict=False)


def test_wrong_shape_names_axes(model):
    sd = sdm.to_state_dict(model)
    sd["out.weight"] = np.zeros((5, 7), np.float32)
    with pytest.raises(
        sdm.StateDictError, match=r"'out.weight' has shape \(5, 7\).*expects \(7, 5\)"
    ):
        sdm.from_state_dict(model, sd)


def test_unexpected_keys_are_an_error_when_strict(model):
    sd = sdm.to_state_dict(model)
    sd["lm_head.weight"] = np.zeros(3)
    with pytest.raises(sdm.StateDictError, match=r"does not use, e.g. \['lm_head.weight'\]"):
        sdm.from_state_dict(model, sd)


def test_load_casts_to_template_dtype(model):
    sd = {k: v.astype(np.float16) for k, v in sdm.to_state_dict(model).items()}
    back = sdm.from_state_dict(model, sd)
    assert back.out.weight.dtype == jnp.float32


def test_save_and_load_state_dict_round_trip_through_safetensors(tmp_path):
    lin = hax.nn.Linear.init(hax.Axis("in", 3), hax.Axis("out", 5), key=jax.random.key(0))
    sd = hax.state_dict.to_numpy_state_dict(lin, prefix="proj")
    path = str(tmp_path / "m.safetensors")
    hax.state_dict.save_state_dict(sd, path)
    loaded = hax.state_dict.load_state_dict(path)
    assert sorted(loaded) == ["proj.bias", "proj.weight"]
    back = hax.state_dict.from_state_dict(lin, loaded, prefix="proj")
    np.testing.assert_array_equal(back.weight.array, lin.weight.array)


def test_flatten_modules_for_export_uses_the_module_hooks():
    A, B = hax.Axis("a", 3), hax.Axis("b", 5)

    class Split(hax.state_dict.ModuleWithStateDictSerialization):
        w: hax.NamedArray

        def flatten_for_export(self):
            return Split(self.w.flatten_axes(("a", "b"), "ab"))

        def unflatten_from_export(self, template):
            return Split(self.w.unflatten_axis("ab", template.w.axes))

    class Outer(eqx.Module):
        inner: Split
        other: hax.NamedArray

    m = Outer(Split(hax.random.normal(jax.random.key(1), (A, B))), hax.ones(A))
    flat = hax.state_dict.flatten_modules_for_export(m)
    assert flat.inner.w.axes == (hax.Axis("ab", 15),)
    assert flat.other.axes == (A,)
    back = hax.state_dict.unflatten_modules_from_export(flat, m)
    np.testing.assert_array_equal(back.inner.w.array, m.inner.w.array)
    assert Split(m.inner.w).to_state_dict()["w"].shape == (3, 5)
