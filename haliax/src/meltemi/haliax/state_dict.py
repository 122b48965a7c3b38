"""Flat state dicts: `{"dotted.path": array}` from a module and back.

Keys follow the module's field names (`mlp.layers.0.weight`); a module can rename or drop
fields with a `_state_dict_key_map(self) -> {field: new_name_or_None}` method (`Stacked` drops
its `stacked` field, so stacked layers live under the stack's own key). Arrays are written in
the NamedArray's axis order unless a module's `_state_dict_axis_order(self) -> {field: names}`
or the `axis_order=` argument says otherwise; loading reorders them back by name.

`to_torch_compatible_state_dict` additionally flattens every `Linear` to PyTorch's 2-D
`[out, in]` weight and splits stacked layers into per-layer keys (`layers.0.`, `layers.1.`),
the layout Hugging Face checkpoints use.

>>> import jax
>>> import meltemi.haliax as hax
>>> lin = hax.nn.Linear.init(hax.Axis("in", 3), hax.Axis("out", 2), key=jax.random.key(0))
>>> sd = hax.state_dict.to_state_dict(lin, prefix="proj")
>>> sorted((k, v.shape) for k, v in sd.items())
[('proj.bias', (2,)), ('proj.weight', (2, 3))]
>>> back = hax.state_dict.from_state_dict(lin, sd, prefix="proj")
>>> bool((back.weight.array == lin.weight.array).all())
True
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from meltemi.haliax._core import Axis, NamedArray, _as_tuple
from meltemi.haliax.nn._linear import Linear
from meltemi.haliax.nn._scan import Stacked

__all__ = [
    "StateDict",
    "StateDictError",
    "to_state_dict",
    "from_state_dict",
    "to_torch_compatible_state_dict",
    "from_torch_compatible_state_dict",
    "unstack_state_dict",
    "stack_state_dict",
    "with_prefix",
    "ModuleWithStateDictSerialization",
    "flatten_modules_for_export",
    "unflatten_modules_from_export",
    "to_numpy_state_dict",
    "save_state_dict",
    "load_state_dict",
]

StateDict = dict[str, Any]
"""`{"dotted.path": array}`: the module's own (jax or numpy) arrays, as Haliax returns them."""
AxisOrder = Callable[[str, NamedArray], Sequence[str] | None]


class StateDictError(KeyError):
    """A state dict that does not fit the module (missing, unexpected or misshapen keys)."""

    def __str__(self):
        return str(self.args[0])


def with_prefix(prefix: str | None, name: str | None) -> str | None:
    """`"a.b"` from `("a", "b")`, skipping empty parts."""
    if not prefix:
        return name
    if not name:
        return prefix
    return f"{prefix}.{name}"


@dataclasses.dataclass
class _Walk:
    torch_compatible: bool
    unstack: bool
    axis_order: AxisOrder | None


def _children(node: Any) -> list[tuple[str | None, Any, Sequence[str] | None]]:
    """(key part, child, axis order) for each child of a module/list/dict node."""
    if isinstance(node, eqx.Module):
        key_map = node._state_dict_key_map() if hasattr(node, "_state_dict_key_map") else {}
        orders = node._state_dict_axis_order() if hasattr(node, "_state_dict_axis_order") else {}
        out = []
        for f in dataclasses.fields(node):
            if f.metadata.get("static", False):
                continue
            part = key_map.get(f.name, f.name)
            out.append((part, getattr(node, f.name), orders.get(f.name)))
        return out
    if isinstance(node, list | tuple):
        return [(str(i), c, None) for i, c in enumerate(node)]
    if isinstance(node, Mapping):
        return [(str(k), c, None) for k, c in node.items()]
    return []


def _linear_flat(layer: Linear, weight: NamedArray) -> tuple[list[Axis], tuple[int, ...]]:
    """Leading (non In/Out) axes and the 2-D torch shape of a Linear's weight."""
    names = {a.name for a in _as_tuple(layer.In)} | {a.name for a in _as_tuple(layer.Out)}  # type: ignore[union-attr]
    lead = [a for a in weight.axes if a.name not in names]
    n_out = math.prod(a.size for a in _as_tuple(layer.Out))  # type: ignore[union-attr]
    n_in = math.prod(a.size for a in _as_tuple(layer.In))  # type: ignore[union-attr]
    return lead, (n_out, n_in)


def _linear_export_order(layer: Linear, x: NamedArray, is_weight: bool) -> list[str]:
    lead = [a.name for a in x.axes if not _in_linear(layer, a.name)]
    outs = [a.name for a in _as_tuple(layer.Out)]  # type: ignore[union-attr]
    ins = [a.name for a in _as_tuple(layer.In)] if is_weight else []  # type: ignore[union-attr]
    return lead + outs + ins


def _in_linear(layer: Linear, name: str) -> bool:
    return any(a.name == name for a in _as_tuple(layer.In) + _as_tuple(layer.Out))  # type: ignore


def _export(x: NamedArray, order: Sequence[str] | None) -> NamedArray:
    return x.rearrange(list(order)) if order is not None else x


def _collect(node: Any, prefix: str | None, walk: _Walk, out: StateDict) -> None:
    if node is None:
        return
    if isinstance(node, NamedArray):
        order = walk.axis_order(prefix or "", node) if walk.axis_order else None
        out[prefix or ""] = _export(node, order).array
        return
    if isinstance(node, jax.Array | np.ndarray):
        out[prefix or ""] = node  # as it is, as Haliax does (`to_numpy_state_dict` for numpy)
        return
    if isinstance(node, Stacked) and walk.unstack:
        for i, layer in enumerate(node.unstacked()):
            _collect(layer, with_prefix(prefix, str(i)), walk, out)
        return
    if isinstance(node, Linear) and walk.torch_compatible:
        for name, x in (("weight", node.weight), ("bias", node.bias)):
            if x is None:
                continue
            x = x.rearrange(_linear_export_order(node, x, name == "weight"))
            lead, (n_out, n_in) = _linear_flat(node, node.weight)
            shape = tuple(a.size for a in lead) + ((n_out, n_in) if name == "weight" else (n_out,))
            out[with_prefix(prefix, name)] = jnp.reshape(x.array, shape)  # type: ignore
        return
    for part, child, order in _children(node):
        if order is not None and isinstance(child, NamedArray):
            out[with_prefix(prefix, part) or ""] = _export(child, order).array
            continue
        _collect(child, with_prefix(prefix, part), walk, out)


def to_state_dict(
    tree: Any, prefix: str | None = None, *, axis_order: AxisOrder | None = None
) -> StateDict:
    """Flattens `tree` (modules, lists, dicts, NamedArrays, arrays) to `{key: array}`.

    The arrays are the tree's own (no copy to host; `to_numpy_state_dict` gathers to numpy).

    `axis_order(key, named_array)` may return the axis names to write an array in (None keeps
    its own order).
    """
    out: StateDict = {}
    _collect(tree, prefix, _Walk(False, False, axis_order), out)
    return out


def to_torch_compatible_state_dict(tree: Any, prefix: str | None = None) -> StateDict:
    """Like `to_state_dict`, with 2-D `[out, in]` Linear weights and per-layer keys."""
    out: StateDict = {}
    _collect(tree, prefix, _Walk(True, True, None), out)
    return out


def _missing(key: str, sd: Mapping[str, Any]) -> StateDictError:
    close = difflib.get_close_matches(key, list(sd), n=3)
    hint = f"; did you mean {close}?" if close else ""
    return StateDictError(f"state dict has no key {key!r}{hint} ({len(sd)} keys present)")


def _load_named(key: str, template: NamedArray, sd: Mapping[str, Any], order, used) -> NamedArray:
    if key not in sd:
        raise _missing(key, sd)
    used.add(key)
    names = list(order) if order is not None else [a.name for a in template.axes]
    axes = [template.resolve_axis(n) for n in names]
    arr = np.asarray(sd[key])
    want = tuple(a.size for a in axes)
    if arr.shape != want:
        raise StateDictError(
            f"state dict key {key!r} has shape {arr.shape} but the module expects {want} "
            f"(axes {[f'{a.name}={a.size}' for a in axes]})"
        )
    x = NamedArray(jnp.asarray(arr, dtype=template.dtype), tuple(axes))
    return x.rearrange([a.name for a in template.axes])


def _load(node: Any, prefix: str | None, sd: Mapping[str, Any], walk: _Walk, used: set) -> Any:
    key = prefix or ""
    if node is None:
        return None
    if isinstance(node, NamedArray):
        order = walk.axis_order(key, node) if walk.axis_order else None
        return _load_named(key, node, sd, order, used)
    if isinstance(node, jax.Array | np.ndarray | jax.ShapeDtypeStruct):
        if key not in sd:
            raise _missing(key, sd)
        used.add(key)
        arr = np.asarray(sd[key])
        if arr.shape != tuple(node.shape):
            raise StateDictError(
                f"state dict key {key!r} has shape {arr.shape}, expected {node.shape}"
            )
        return jnp.asarray(arr, dtype=node.dtype)
    if isinstance(node, Stacked) and walk.unstack:
        layers = [
            _load(node.get_layer(i), with_prefix(prefix, str(i)), sd, walk, used)
            for i in range(node.Block.size)
        ]
        return Stacked.from_layers(node.Block, layers, node.gradient_checkpointing)
    if isinstance(node, Linear) and walk.torch_compatible:
        new = {}
        for name in ("weight", "bias"):
            x = getattr(node, name)
            if x is None:
                new[name] = None
                continue
            k = with_prefix(prefix, name)
            order = _linear_export_order(node, x, name == "weight")
            ordered = [x.resolve_axis(n) for n in order]
            lead, (n_out, n_in) = _linear_flat(node, x if name == "weight" else node.weight)
            if k not in sd:
                raise _missing(k, sd)  # type: ignore[arg-type]
            arr = np.asarray(sd[k])
            flat = tuple(a.size for a in lead) + ((n_out, n_in) if name == "weight" else (n_out,))
            if arr.shape != flat:
                raise StateDictError(f"state dict key {k!r} has shape {arr.shape}, expected {flat}")
            used.add(k)
            full = NamedArray(
                jnp.asarray(arr.reshape([a.size for a in ordered]), dtype=x.dtype), tuple(ordered)
            )
            new[name] = full.rearrange([a.name for a in x.axes])
        return dataclasses.replace(node, **new)
    if isinstance(node, eqx.Module):
        orders = node._state_dict_axis_order() if hasattr(node, "_state_dict_axis_order") else {}
        key_map = node._state_dict_key_map() if hasattr(node, "_state_dict_key_map") else {}
        updates = {}
        for f in dataclasses.fields(node):
            if f.metadata.get("static", False):
                continue
            child = getattr(node, f.name)
            part = with_prefix(prefix, key_map.get(f.name, f.name))
            if f.name in orders and isinstance(child, NamedArray):
                updates[f.name] = _load_named(part or "", child, sd, orders[f.name], used)
            else:
                updates[f.name] = _load(child, part, sd, walk, used)
        return _replace_fields(node, updates)
    if isinstance(node, list | tuple):
        items = [_load(c, with_prefix(prefix, str(i)), sd, walk, used) for i, c in enumerate(node)]
        return type(node)(items) if isinstance(node, list) else tuple(items)
    if isinstance(node, Mapping):
        return {k: _load(c, with_prefix(prefix, str(k)), sd, walk, used) for k, c in node.items()}
    return node


def _replace_fields(module: eqx.Module, updates: dict[str, Any]) -> eqx.Module:
    leaves = [updates[k] for k in updates]
    return eqx.tree_at(
        lambda m: [getattr(m, k) for k in updates], module, leaves, is_leaf=lambda x: x is None
    )


def _finish(sd: Mapping[str, Any], used: set, prefix: str | None, strict: bool) -> None:
    if not strict:
        return
    scope = [k for k in sd if prefix is None or k == prefix or k.startswith(prefix + ".")]
    extra = sorted(set(scope) - used)
    if extra:
        raise StateDictError(
            f"state dict has {len(extra)} keys the module does not use, e.g. {extra[:3]}; "
            f"pass strict=False to ignore them"
        )


def from_state_dict(
    template: Any,
    state_dict: Mapping[str, Any],
    prefix: str | None = None,
    *,
    axis_order: AxisOrder | None = None,
    strict: bool = True,
) -> Any:
    """Fills `template` (a module, possibly from `eqx.filter_eval_shape`) from `state_dict`.

    Arrays are cast to the template's dtypes. With `strict`, keys under `prefix` that the
    module does not use are an error.

    Args:
        template: the module to fill (may hold ShapeDtypeStructs).
        state_dict: `{key: array}`.
        prefix: key prefix of the module.
        axis_order: `axis_order(key, template_array)` gives the stored axis order.
        strict: fail on keys under `prefix` that the module does not use.
    """
    used: set = set()
    out = _load(template, prefix, state_dict, _Walk(False, False, axis_order), used)
    _finish(state_dict, used, prefix, strict)
    return out


def from_torch_compatible_state_dict(
    template: Any, state_dict: Mapping[str, Any], prefix: str | None = None, *, strict: bool = True
) -> Any:
    """The inverse of `to_torch_compatible_state_dict`.

    Args:
        template: the module to fill.
        state_dict: `{key: array}` in PyTorch layout.
        prefix: key prefix of the module.
        strict: fail on unused keys under `prefix`.
    """
    used: set = set()
    out = _load(template, prefix, state_dict, _Walk(True, True, None), used)
    _finish(state_dict, used, prefix, strict)
    return out


def unstack_state_dict(state_dict: Mapping[str, Any], prefix: str) -> StateDict:
    """Splits arrays under `prefix.` along their first dim into `prefix.0.`, `prefix.1.`, ..."""
    out: StateDict = {}
    for k, v in state_dict.items():
        if k.startswith(prefix + "."):
            rest = k[len(prefix) + 1 :]
            arr = np.asarray(v)
            for i in range(arr.shape[0]):
                out[f"{prefix}.{i}.{rest}"] = arr[i]
        else:
            out[k] = v
    return out


def stack_state_dict(state_dict: Mapping[str, Any], prefix: str) -> StateDict:
    """Joins `prefix.0.x`, `prefix.1.x`, ... into `prefix.x` with a leading layer dim."""
    pat = re.compile(re.escape(prefix) + r"\.(\d+)\.(.+)$")
    groups: dict[str, dict[int, Any]] = {}
    out: StateDict = {}
    for k, v in state_dict.items():
        m = pat.match(k)
        if m:
            groups.setdefault(m.group(2), {})[int(m.group(1))] = v
        else:
            out[k] = v
    for rest, layers in groups.items():
        n = max(layers) + 1
        if sorted(layers) != list(range(n)):
            missing = sorted(set(range(n)) - set(layers))
            raise StateDictError(f"stack_state_dict: {prefix}.N.{rest} is missing layers {missing}")
        out[f"{prefix}.{rest}"] = np.stack([np.asarray(layers[i]) for i in range(n)])
    return out


class ModuleWithStateDictSerialization(eqx.Module):
    """A module base with Haliax's state-dict hooks.

    Override `_state_dict_key_map` to rename fields, and `flatten_for_export` /
    `unflatten_from_export` to change the array layout for PyTorch-style checkpoints (used by
    `flatten_modules_for_export`). The defaults keep the module as it is.
    """

    def to_state_dict(self, prefix: str | None = None) -> StateDict:
        return to_state_dict(self, prefix)

    def from_state_dict(self, state_dict: StateDict, prefix: str | None = None) -> Any:
        return from_state_dict(self, state_dict, prefix)

    def _state_dict_key_map(self) -> dict[str, str | None]:
        return {}

    def flatten_for_export(self) -> Any:
        """This module with its arrays in export layout (e.g. a Linear's axes flattened)."""
        return self

    def unflatten_from_export(self, template: Any) -> Any:
        """The inverse of `flatten_for_export`; `template` has the original structure."""
        del template
        return self


def _is_serializable(x: Any) -> bool:
    # duck-typed, as nn layers define the export hooks without subclassing (no import cycle)
    return isinstance(x, eqx.Module) and hasattr(x, "flatten_for_export")


def flatten_modules_for_export(t: Any) -> Any:
    """`t` with `flatten_for_export()` applied to every ModuleWithStateDictSerialization in it
    (outermost first; then to the modules inside the result)."""

    def visit(m: Any) -> Any:
        if not _is_serializable(m):
            return m
        m = m.flatten_for_export()
        return _map_children(visit, m)

    return _map_modules(visit, t)


def unflatten_modules_from_export(t: Any, template: Any) -> Any:
    """The inverse of `flatten_modules_for_export`, guided by `template`'s structure."""

    def visit(m: Any, tm: Any) -> Any:
        if not _is_serializable(m):
            return m
        m = m.unflatten_from_export(tm)
        return _map_children(visit, m, tm)

    return _map_modules(visit, t, template)


def _map_modules(fn: Callable, t: Any, *rest: Any) -> Any:
    return jax.tree.map(fn, t, *rest, is_leaf=_is_serializable)


def _map_children(fn: Callable, m: Any, *rest: Any) -> Any:
    """`fn` on the serializable modules strictly inside `m` (not `m` itself)."""
    return jax.tree.map(fn, m, *rest, is_leaf=lambda x: x is not m and _is_serializable(x))


def to_numpy_state_dict(model: Any, prefix: str | None = None) -> StateDict:
    """`to_state_dict` with every array gathered to this host as numpy (also arrays sharded
    over several hosts, via `process_allgather`)."""

    def to_host(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return x

    sd = to_state_dict(jax.tree.map(to_host, model), prefix)
    return {k: np.asarray(v) for k, v in sd.items()}


def save_state_dict(state_dict: Mapping[str, Any], path: str) -> None:
    """Writes `state_dict` to a safetensors file (needs the `safetensors` package; only process
    0 writes)."""
    safetensors_numpy = _safetensors()
    arrays = {
        k: np.ascontiguousarray(np.asarray(v)) for k, v in state_dict.items() if v is not None
    }
    if jax.process_index() == 0:
        safetensors_numpy.save_file(arrays, path, metadata={"format": "pt"})
    multihost_utils.sync_global_devices(f"meltemi.haliax save_state_dict {path}")


def load_state_dict(path: str) -> StateDict:
    """Reads a safetensors file into `{key: np.ndarray}`."""
    return dict(_safetensors().load_file(path))


def _safetensors() -> Any:
    try:
        return importlib.import_module("safetensors.numpy")
    except ImportError as e:
        raise ImportError(
            "save_state_dict/load_state_dict need the safetensors package: "
            "pip install 'meltemi-haliax[safetensors]'"
        ) from e
