"""Mesh construction from mesh.ici / mesh.dcn."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import pytest  # noqa: E402

from meltemi.levanter.mesh import MeshConfigError, MeshShape, make_mesh  # noqa: E402


def test_minus_one_fills_the_remaining_devices():
    mesh = make_mesh({"fsdp": -1, "tensor": 2})
    assert dict(mesh.shape) == {
        "replica": 1,
        "data": 1,
        "fsdp": 4,
        "expert": 1,
        "sequence": 1,
        "tensor": 2,
    }


def test_dcn_axis_spans_slices_and_keeps_slices_contiguous():
    mesh = make_mesh({"fsdp": -1}, {"data": -1}, num_slices=2)
    assert mesh.shape["data"] == 2 and mesh.shape["fsdp"] == 4
    first = {d.id for d in mesh.devices[0, 0].reshape(-1)}
    assert first == {0, 1, 2, 3}


def test_two_fill_axes_are_rejected():
    with pytest.raises(MeshConfigError, match=r"at most one axis may fill"):
        MeshShape.resolve({"data": -1, "fsdp": -1}, {}, 8, 1)


def test_sizes_that_do_not_divide_devices_are_rejected():
    with pytest.raises(MeshConfigError, match=r"multiply to 3, which does not divide the 8"):
        MeshShape.resolve({"data": -1, "tensor": 3}, {}, 8, 1)


def test_unknown_axis_is_rejected():
    with pytest.raises(MeshConfigError, match=r"mesh.ici.model: unknown mesh axis"):
        MeshShape.resolve({"model": 2}, {}, 8, 1)


def test_fixed_sizes_must_cover_all_devices():
    with pytest.raises(MeshConfigError, match=r"multiply to 4, but there are 8"):
        MeshShape.resolve({"data": 2, "fsdp": 2}, {}, 8, 1)


def test_mesh_uses_every_device_once():
    mesh = make_mesh({"data": 2, "fsdp": -1, "tensor": 2})
    assert sorted(d.id for d in mesh.devices.reshape(-1)) == [d.id for d in jax.devices()]
