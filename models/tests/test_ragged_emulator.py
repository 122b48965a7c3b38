"""`meltemi.models.testing.ragged_all_to_all_on_cpu`: the only place that reaches into JAX's
private lowering table, checked at import against the pinned JAX, and bounded in pyproject.

The emulator's semantics (the documented example, random exchanges and their gradients) are
checked in test_moe_ep.py.
"""

import pathlib
import re
import tomllib
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import mlir
from packaging.requirements import Requirement

import meltemi.models as mm
from meltemi.models import testing
from meltemi.models.moe import _ep as _moe_ep

PRODUCT = pathlib.Path(mm.__file__).parent


def _lowered_text() -> str:
    """A fresh (uncached) jitted `ragged_all_to_all` on one CPU device, lowered to text."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    ones = jnp.ones(1, jnp.int32)

    def send(x):
        return jax.lax.ragged_all_to_all(x, jnp.zeros(3), ones, ones, 0 * ones, ones, axis_name="x")

    spec = jax.sharding.PartitionSpec()
    f = jax.jit(jax.shard_map(send, mesh=mesh, in_specs=spec, out_specs=spec))
    return f.lower(jnp.arange(3.0)).as_text()


def test_the_private_lowering_table_is_found_on_the_pinned_jax_without_a_warning():
    # Fails when the fallback would be taken: JAX moved or reshaped what the emulator uses.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = testing._cpu_lowerings()
    assert table is mlir._platform_specific_lowerings["cpu"]
    assert testing._CPU_LOWERINGS is table


def test_leaving_the_block_puts_back_the_real_lowering():
    assert "custom_call @ragged_all_to_all" in _lowered_text()
    with testing.ragged_all_to_all_on_cpu():
        inside = _lowered_text()
    assert "custom_call @ragged_all_to_all" not in inside, inside
    assert "stablehlo.scatter" in inside, inside  # the emulator writes the received rows
    assert "custom_call @ragged_all_to_all" in _lowered_text()  # not the emulator's, no error


@pytest.mark.parametrize(
    "changed",
    [
        types.SimpleNamespace(register_lowering=mlir.register_lowering, lower_fun=mlir.lower_fun),
        types.SimpleNamespace(
            _platform_specific_lowerings={"cpu": {}},
            register_lowering=lambda rule, prim, platform=None: None,
            lower_fun=mlir.lower_fun,
        ),
    ],
    ids=["no table", "register_lowering reordered"],
)
def test_a_changed_jax_gives_one_warning_naming_the_version_and_the_fix(changed):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert testing._cpu_lowerings(changed) is None
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert re.search(
        rf"jax {re.escape(jax.__version__)} lacks .*_platform_specific_lowerings.*"
        r"Fix: install jax>=0\.10,<0\.11",
        message,
    ), message


def test_the_ragged_exchange_is_accepted_on_cpu_only_inside_the_block(monkeypatch):
    monkeypatch.setattr(_moe_ep, "_platform", lambda: "cpu")
    with pytest.raises(mm.ConfigError, match=r"ep_exchange='ragged'.*'cpu'.*Fix: "):
        _moe_ep.resolve_exchange("ragged")
    with testing.ragged_all_to_all_on_cpu():
        assert _moe_ep.resolve_exchange("ragged") == "ragged"
        assert _moe_ep.resolve_exchange("auto") == "dense"  # auto is unchanged by the block
    with pytest.raises(mm.ConfigError, match=r"ep_exchange='ragged'"):
        _moe_ep.resolve_exchange("ragged")


def test_no_product_module_reaches_into_private_jax():
    private = re.compile(r"jax\._src|mlir\._|_platform_specific_lowerings")
    found = [
        f"{path.name}:{n}"
        for path in sorted(PRODUCT.glob("*.py"))
        if path.name != "testing.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert len(list(PRODUCT.glob("_*.py"))) > 10  # the scan sees the product modules
    assert found == []


def test_pyproject_bounds_jax_at_the_tested_minor_version():
    # testing.py uses JAX's private lowering table: allowed only below the next minor version.
    pyproject = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())
    (jax_req,) = [
        Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "jax"
    ]
    assert jax.__version__ in jax_req.specifier
    major, minor = (int(p) for p in jax.__version__.split(".")[:2])
    assert f"{major}.{minor + 1}" not in jax_req.specifier, jax_req
    assert f"{major}.{minor}.99" in jax_req.specifier, jax_req
