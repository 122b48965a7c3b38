"""House style: every public function or method with 4+ parameters documents them in `Args:`."""

from __future__ import annotations

import importlib
import inspect

MODULES = [
    "meltemi.haliax",
    "meltemi.haliax.nn",
    "meltemi.haliax.nn.attention",
    "meltemi.haliax.partitioning",
    "meltemi.haliax.random",
    "meltemi.haliax.tree_util",
    "meltemi.haliax.state_dict",
    "meltemi.haliax.quantization",
    "meltemi.haliax.debug",
    "meltemi.haliax.specialized_fns",
    "meltemi.haliax.axis",
    "meltemi.haliax.core",
    "meltemi.haliax.haxtyping",
    "meltemi.haliax.jax_utils",
    "meltemi.haliax.nn.conv",
    "meltemi.haliax.nn.pool",
    "meltemi.haliax.nn.scan",
]


def _param_count(fn) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 0
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return sum(
        p.kind not in variadic and p.name not in ("self", "cls") for p in sig.parameters.values()
    )


def _public_functions():
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for name in getattr(mod, "__all__", [n for n in dir(mod) if not n.startswith("_")]):
            obj = getattr(mod, name, None)
            if inspect.isfunction(obj):
                yield obj
            elif inspect.isclass(obj):
                for attr_name, attr in vars(obj).items():
                    if attr_name.startswith("_"):
                        continue
                    if isinstance(attr, staticmethod | classmethod):
                        attr = attr.__func__
                    if inspect.isfunction(attr):
                        yield attr


def test_functions_with_four_or_more_parameters_have_an_args_section():
    missing = sorted(
        {
            f"{fn.__module__}.{fn.__qualname__}"
            for fn in _public_functions()
            if (fn.__module__ or "").startswith("meltemi.haliax")
            and _param_count(fn) >= 4
            and "Args:" not in (fn.__doc__ or "")
        }
    )
    assert not missing, (
        "public functions with 4+ parameters lacking an Args: section:\n" + "\n".join(missing)
    )


def test_the_check_sees_functions():
    # Guards against the walk above silently finding nothing.
    many = [fn for fn in _public_functions() if _param_count(fn) >= 4]
    assert len(many) > 50
