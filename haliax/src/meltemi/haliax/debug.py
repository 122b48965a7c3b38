"""Debugging helpers: find common mistakes in a module, and print how arrays are sharded.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> hax.debug.describe_array(hax.ones(hax.Axis("a", 3)))
"NamedArray(axes=(Axis(name='a', size=3),), dtype=float32)"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax

from meltemi.haliax._core import Axis, NamedArray

__all__ = [
    "describe_array",
    "ModuleProblems",
    "diagnose_common_issues",
    "visualize_named_sharding",
    "visualize_shardings",
]


def _is_array(x: Any) -> bool:
    return isinstance(x, NamedArray | jax.Array)


def describe_array(arr: Any) -> str:
    """A one-line description: axes (or shape) and dtype."""
    if isinstance(arr, NamedArray):
        return f"NamedArray(axes={arr.axes}, dtype={arr.dtype})"
    return f"ndarray(shape={arr.shape}, dtype={arr.dtype})"


class ModuleProblems(Exception):
    """What `diagnose_common_issues` found: arrays stored twice, arrays in static fields."""

    def __init__(self):
        super().__init__()
        self.reused_arrays: list[tuple[Any, list[str]]] = []
        self.static_arrays: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.reused_arrays or self.static_arrays)

    def __str__(self) -> str:
        if not self:
            return "No problems found"
        lines = ["Found some problems with your module:"]
        lines += [
            f"  Reused array {describe_array(a)} at paths {paths} (store it once; share by "
            f"reference in __call__ instead)"
            for a, paths in self.reused_arrays
        ]
        lines += [
            f"  Static array at field {f} (arrays must be leaves, not eqx.field(static=True))"
            for f in self.static_arrays
        ]
        return "\n".join(lines)


def diagnose_common_issues(module: eqx.Module) -> None:
    """Raises ModuleProblems if one array object sits at two paths of `module` (gradients and
    sharding would treat them as two parameters) or an array is in a static field; then runs
    `eqx.tree_check`."""
    problems = ModuleProblems()
    seen: dict[int, tuple[Any, list[str]]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(module, is_leaf=_is_array)[0]:
        if _is_array(leaf):
            key = id(leaf.array if isinstance(leaf, NamedArray) else leaf)
            seen.setdefault(key, (leaf, []))[1].append(jax.tree_util.keystr(path))
    problems.reused_arrays = [(a, p) for a, p in seen.values() if len(p) > 1]

    def visit(x: Any, path: str) -> None:
        if isinstance(x, eqx.Module):
            for f in dataclasses.fields(x):
                v = getattr(x, f.name, None)
                if f.metadata.get("static", False) and _is_array(v):
                    problems.static_arrays.append(f"{path}.{f.name}")
                else:
                    visit(v, f"{path}.{f.name}")
        elif isinstance(x, list | tuple):
            for i, v in enumerate(x):
                visit(v, f"{path}[{i}]")
        elif isinstance(x, dict):
            for k, v in x.items():
                visit(v, f"{path}[{k!r}]")

    visit(module, "")
    if problems:
        raise problems
    eqx.tree_check(module)


def _part(p: Any) -> str:
    if p is None:
        return "unsharded"
    if isinstance(p, tuple | list):
        return "+".join(str(x) for x in p)
    return str(p)


def visualize_named_sharding(axes: Sequence[Axis], sharding: jax.sharding.Sharding) -> None:
    """Prints `axis->mesh axes` per axis (and JAX's grid picture for 1-d and 2-d arrays)."""
    spec = getattr(sharding, "spec", None) or (None,) * len(axes)
    parts = [_part(p) for p in tuple(spec) + (None,) * (len(axes) - len(tuple(spec)))]
    if sum(p != "unsharded" for p in parts) <= 2 and 0 < len(axes) <= 2:
        try:
            jax.debug.visualize_sharding(tuple(a.size for a in axes), sharding)
        except Exception:  # the picture is a bonus; the text line below always prints
            pass
    print(", ".join(f"{a.name}->{p}" for a, p in zip(axes, parts)))


def visualize_shardings(tree: Any) -> None:
    """Prints the sharding of every array leaf of `tree` (works inside jit)."""

    def show(x):
        arr, axes = (x.array, x.axes) if isinstance(x, NamedArray) else (x, None)

        def cb(sh):
            if axes is not None:
                visualize_named_sharding(axes, sh)
            else:
                print(f"shape {arr.shape}: {getattr(sh, 'spec', sh)}")

        jax.debug.inspect_array_sharding(arr, callback=cb)
        return x

    jax.tree.map(show, tree, is_leaf=_is_array)
