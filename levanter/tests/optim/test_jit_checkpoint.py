"""Every transform jits without recompiling, donates, and checkpoints/restores bit for bit.

The restore goes through the trainer's `Checkpointer` (orbax, on disk), and the restored state
must drive the next step to the same bits as the live one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meltemi.levanter import optim
from meltemi.levanter.checkpoint import Checkpointer

try:
    import meltemi.haliax as hax

    def _stacked(array):
        return hax.named(array, ("layers", "embed", "mlp"))

except (ImportError, AttributeError):  # pragma: no cover - only before haliax lands

    def _stacked(array):
        return array


def _params():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {
        "embed": jax.random.normal(k1, (11, 3)),
        "layers": {"w": _stacked(jax.random.normal(k2, (3, 5, 7))), "norm": jnp.ones(5)},
        "w_out": jax.random.normal(k3, (3, 5)),
    }


def _grads(t):
    return jax.tree.map(lambda p: jnp.sin(p * (t + 1.0)) * (1.0 + 0.1 * t), _params())


SCHEDULE = optim.wsd_schedule(1e-2, 20, warmup=2, decay=0.5, cycles=(10,), rewarmup=2)
MARIN = {
    "learning_rate": 1e-2, "total_steps": 20, "lr_schedule": "linear", "warmup": 0.1,
    "decay": 0.4, "cycles": [10], "rewarmup": 2, "weight_decay": 0.1, "adamc": "decay",
    "max_grad_norm": [[0, 1.0], [3, 0.2]], "update_clip_window": 4, "update_clip_warmup": 2,
    "skip_step_window": 4, "skip_step_warmup": 2, "ema_beta": 0.995,
}  # fmt: skip

TRANSFORMS = {
    "adamw_adamc": lambda: optim.adamw(SCHEDULE, weight_decay=0.1, adamc="decay"),
    "clip_by_global_norm": lambda: optim.clip_by_global_norm(optim.step_schedule([(0, 1.0)])),
    "clip_update_norm": lambda: optim.clip_update_norm(window=4, sigma=2.0, warmup=2),
    "skip_step": lambda: optim.skip_step(optim.adamw(1e-2), window=4, warmup=2),
    "muon": lambda: optim.muon(
        SCHEDULE, adam_learning_rate=1e-3, weight_decay=0.1, adamc="always", mu_dtype="bfloat16"
    ),
    "ema": lambda: optax.chain(optax.sgd(1e-2), optim.ema_params(0.995)),
    "marin_config": lambda: optim.build_optimizer(MARIN)[0],
    "muon_config": lambda: optim.build_optimizer(
        {**MARIN, "name": "muon", "adam_learning_rate": 1e-3}
    )[0],
    "mu_dtype_multipliers_config": lambda: optim.build_optimizer(
        {**MARIN, "mu_dtype": "bfloat16", "lr_multipliers": [["w_out", 0.5]]}
    )[0],
}


def _make_step(tx):
    tx = optax.with_extra_args_support(tx)

    @jax.jit
    def step(params, state, grads, loss):
        updates, state = tx.update(grads, state, params, loss=loss)
        return optax.apply_updates(params, updates), state

    return tx, step


def _assert_bit_identical(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save_and_restore(tmp_path, state):
    ckpt = Checkpointer(tmp_path / "ckpt")  # verify="checksums": every state dtype checked
    ckpt.save(3, state, config_json="{}")
    ckpt.wait()
    zeros = jax.tree.map(jnp.zeros_like, state)  # a template holding none of the values
    step, restored = ckpt.restore(zeros)
    ckpt.close()
    assert step == 3
    return restored


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_jits_once_and_restores_bit_identically(name, tmp_path):
    tx, step = _make_step(TRANSFORMS[name]())
    # Committed to a device, as the trainer's state is (and as restored arrays are).
    params = jax.device_put(_params(), jax.devices()[0])
    state = jax.device_put(tx.init(params), jax.devices()[0])
    for t in range(3):
        params, state = step(params, state, _grads(t), jnp.float32(2.0 + 0.01 * t))
    assert step._cache_size() == 1, "the second and later steps recompiled"
    restored = _save_and_restore(tmp_path, state)
    _assert_bit_identical(restored, state)
    p1, s1 = step(params, state, _grads(3), jnp.float32(2.0))
    p2, s2 = step(params, restored, _grads(3), jnp.float32(2.0))
    _assert_bit_identical((p1, s1), (p2, s2))
    assert step._cache_size() == 1


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_initial_state_can_be_donated(name):
    # Two state fields sharing one buffer make a donated jit call fail ("donate the same
    # buffer twice"), as the trainer's step donates the whole state.
    tx = optax.with_extra_args_support(TRANSFORMS[name]())
    state = tx.init(_params())
    leaves = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array)]
    assert len({id(x) for x in leaves}) == len(leaves)
    assert len({x.unsafe_buffer_pointer() for x in leaves if x.size}) == len(
        [x for x in leaves if x.size]
    )


def test_orbax_round_trip_of_the_full_chain_is_bit_identical(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    tx, step = _make_step(TRANSFORMS["marin_config"]())
    params = _params()
    state = tx.init(params)
    for t in range(3):
        params, state = step(params, state, _grads(t), jnp.float32(2.0))
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "opt", state)
        ckpt.wait_until_finished()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = ckpt.restore(tmp_path / "opt", abstract)
    _assert_bit_identical(restored, state)
