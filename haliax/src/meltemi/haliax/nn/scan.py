"""`haliax.nn.scan`: the stacked-layer modules at the module path Haliax code imports.

`_stack_state_dict` / `_unstack_state_dict` are Haliax's private names for
`state_dict.stack_state_dict` / `unstack_state_dict`, kept because ported tests import them.
"""

from meltemi.haliax._remat import ScanCheckpointPolicy
from meltemi.haliax.nn._scan import BlockSeq, Stacked
from meltemi.haliax.state_dict import stack_state_dict as _stack_state_dict  # noqa: F401
from meltemi.haliax.state_dict import unstack_state_dict as _unstack_state_dict  # noqa: F401

__all__ = ["BlockSeq", "ScanCheckpointPolicy", "Stacked"]
