"""`haliax._src.state_dict`: state-dict helpers at the module path Haliax code imports."""

from meltemi.haliax.state_dict import (
    ModuleWithStateDictSerialization,
    StateDict,
    flatten_modules_for_export,
    from_state_dict,
    to_state_dict,
    unflatten_modules_from_export,
    with_prefix,
)

__all__ = [
    "ModuleWithStateDictSerialization",
    "StateDict",
    "flatten_modules_for_export",
    "from_state_dict",
    "to_state_dict",
    "unflatten_modules_from_export",
    "with_prefix",
]
