"""Schedule values at every phase boundary, cycles with re-warmup, and batch-size schedules."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meltemi.levanter import optim


def _values(schedule, steps):
    return [float(schedule(s)) for s in steps]


def test_constant_schedule_is_constant_after_its_warmup():
    s = optim.constant_schedule(0.3, warmup=4)
    np.testing.assert_allclose(_values(s, [0, 2, 4, 5, 10_000]), [0.0, 0.15, 0.3, 0.3, 0.3])
    assert not bool(s.in_decay(10_000))


def test_linear_schedule_boundaries():
    s = optim.linear_schedule(2.0, 21, warmup=3, min_ratio=0.1)
    # warmup 0..3, then linear from 2.0 at step 3 to 0.2 at step 21 (18 steps)
    np.testing.assert_allclose(
        _values(s, [0, 1, 3, 12, 21, 50]), [0.0, 2 / 3, 2.0, 1.1, 0.2, 0.2], rtol=1e-6
    )


def test_cosine_schedule_boundaries():
    s = optim.cosine_schedule(1.0, 13, warmup=5, min_ratio=0.0)
    np.testing.assert_allclose(
        _values(s, [0, 5, 9, 13]), [0.0, 1.0, 0.5, 0.0], rtol=1e-6, atol=1e-7
    )
    assert float(s(7)) == pytest.approx(0.5 * (1 + math.cos(math.pi * 2 / 8)), rel=1e-6)


def test_inverse_sqrt_schedule_boundaries():
    s = optim.inverse_sqrt_schedule(1.0, 1000, warmup=4, min_ratio=0.1)
    np.testing.assert_allclose(_values(s, [0, 2, 4, 16, 36]), [0.0, 0.5, 1.0, 0.5, 1 / 3], 1e-6)
    assert float(s(10_000)) == pytest.approx(0.1)  # floored at peak * min_ratio


@pytest.mark.parametrize(
    ("shape", "midpoint"),
    [("linear", 0.5), ("cosine", 0.5), ("1-sqrt", 1 - math.sqrt(0.5))],
)
def test_wsd_boundaries_for_each_decay_shape(shape, midpoint):
    s = optim.wsd_schedule(1.0, 100, warmup=0.05, decay=0.4, shape=shape, min_ratio=0.1)
    low = 0.1
    expected = {
        0: 0.0,
        5: 1.0,  # warmup ends
        59: 1.0,
        60: 1.0,  # decay starts (progress 0)
        80: low + (1 - low) * midpoint,
        100: low,
        101: low,
    }
    for step, value in expected.items():
        assert float(s(step)) == pytest.approx(value, rel=1e-6, abs=1e-7), step
    assert [bool(s.in_decay(t)) for t in (59, 60, 100)] == [False, True, True]


def test_cycles_rewarm_from_the_previous_minimum():
    s = optim.wsd_schedule(
        1.0, 300, warmup=10, decay=0.5, shape="linear", min_ratio=0.2,
        cycles=(100,), rewarmup=20,
    )  # fmt: skip
    # cycle 1: steps 0..100, decay 50..100; cycle 2: 100..300, re-warmup 20, decay 200..300
    expected = {
        0: 0.0, 10: 1.0, 50: 1.0, 75: 0.6, 99: 0.2 + 0.8 / 50,
        100: 0.2, 110: 0.6, 120: 1.0, 199: 1.0, 200: 1.0, 250: 0.6, 300: 0.2,
    }  # fmt: skip
    for step, value in expected.items():
        assert float(s(step)) == pytest.approx(value, rel=1e-6), step
    assert [p["decay_start"] for p in s.phases()] == [50, 200]


def test_integer_cycles_split_the_run_evenly():
    s = optim.wsd_schedule(1.0, 90, warmup=0, decay=0.5, cycles=3, rewarmup=0)
    assert [p["start"] for p in s.phases()] == [0, 30, 60]
    assert _values(s, [15, 30, 45, 60]) == pytest.approx([1.0, 1.0, 1.0, 1.0])


def test_boundaries_are_exact_at_steps_beyond_float32_integers():
    s = optim.wsd_schedule(1.0, 40_000_000, warmup=0, decay=20_000_001, shape="linear")
    assert [bool(s.in_decay(t)) for t in (19_999_998, 19_999_999)] == [False, True]
    assert float(s(19_999_998)) == 1.0


def test_schedule_works_on_traced_steps_under_jit():
    s = optim.wsd_schedule(1.0, 100, warmup=5, decay=0.4, cycles=(50,), rewarmup=5)
    steps = jnp.arange(101)
    np.testing.assert_array_equal(jax.jit(jax.vmap(s))(steps), jnp.stack([s(t) for t in steps]))


def test_float_warmup_above_one_is_an_error_that_suggests_an_int():
    with pytest.raises(optim.ScheduleError, match=r"warmup=20.0 is a float.*warmup=20"):
        optim.wsd_schedule(1.0, 100, warmup=20.0)


def test_warmup_plus_decay_longer_than_the_cycle_is_an_error():
    with pytest.raises(optim.ScheduleError, match="exceed cycle 0's length"):
        optim.wsd_schedule(1.0, 100, warmup=70, decay=0.5)


def test_unsorted_cycle_starts_are_an_error():
    with pytest.raises(optim.ScheduleError, match="strictly increasing"):
        optim.wsd_schedule(1.0, 100, cycles=(60, 40))


def test_unknown_decay_shape_is_an_error():
    with pytest.raises(optim.ScheduleError, match="shape='exp' is not one of"):
        optim.Schedule(1.0, 10, shape="exp")


def test_batch_size_schedule_steps_and_offsets():
    b = optim.batch_size_schedule([(0, 3), (5, 7), (9, 11)])
    assert [b(s) for s in (0, 4, 5, 8, 9, 100)] == [3, 3, 7, 7, 11, 11]
    assert [b.examples_before(s) for s in (0, 5, 6, 9, 10)] == [0, 15, 22, 43, 54]
    assert optim.batch_size_schedule(13)(1000) == 13


def test_batch_size_schedule_must_start_at_step_zero():
    with pytest.raises(optim.ScheduleError, match="must start at step 0"):
        optim.batch_size_schedule({5: 8})
