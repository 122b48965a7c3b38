"""Named code compiles to the same work as hand-written jnp, and is not recompiled."""

import equinox as eqx
import jax
import named_vs_jnp as B
import numpy as np
import pytest

import meltemi.haliax as hax

SIZES = B.Sizes()


@pytest.fixture(scope="module")
def blocks():
    return B.make(SIZES)


def _cost(fn, *args):
    c = jax.jit(fn).lower(*args).compile().cost_analysis()
    c = c[0] if isinstance(c, list) else c
    return c["flops"]


CASES = {
    "mlp": (0, B.jnp_mlp_block, B.mlp_params),
    "attention": (1, B.jnp_attn_block, B.attn_params),
}


@pytest.mark.parametrize("case", list(CASES))
def test_named_block_computes_the_same_as_jnp(blocks, case):
    i, fn, params = CASES[case]
    block, x = blocks[i], blocks[2]
    out = eqx.filter_jit(lambda b, x: b(x))(block, x)
    ref = jax.jit(fn)(params(block), x.array)
    assert out.axes == x.axes
    np.testing.assert_allclose(out.array, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_flops_equal_hand_written(blocks, case):
    i, fn, params = CASES[case]
    block, x = blocks[i], blocks[2]
    named = _cost(lambda b, x: b(x).array, block, x)
    manual = _cost(fn, params(block), x.array)
    assert named == manual, f"{case}: named {named} flops vs hand-written {manual}"


@pytest.mark.parametrize("case", list(CASES))
def test_forward_backward_flops_equal_hand_written(blocks, case):
    i, fn, params = CASES[case]
    block, x = blocks[i], blocks[2]
    named = _cost(jax.grad(B.named_loss), block, x)
    manual = _cost(jax.grad(B.jnp_loss(fn)), params(block), x.array)
    assert named == manual, f"{case}: named {named} flops vs hand-written {manual}"


def test_jitted_step_is_not_retraced_on_second_call(blocks):
    traces = []

    @eqx.filter_jit
    def step(block, x):
        traces.append(1)
        loss, grads = eqx.filter_value_and_grad(B.named_loss)(block, x)
        return loss, jax.tree.map(lambda p, g: p - 0.1 * g, block, grads)

    block, x = blocks[1], blocks[2]
    _, block = step(block, x)
    _, block = step(block, x * 2.0)
    assert len(traces) == 1
    with jax.no_tracing():  # raises if anything would be traced (and so compiled) again
        step(block, x)


def test_axis_objects_are_static_so_equal_axes_hit_the_cache(blocks):
    f = jax.jit(lambda x: hax.sum(x, "embed").array)
    x = blocks[2]
    f(x)
    y = hax.named(x.array + 1, tuple(hax.Axis(a.name, a.size) for a in x.axes))  # new Axis objects
    with jax.no_tracing():
        f(y)
