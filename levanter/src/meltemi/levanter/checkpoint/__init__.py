"""Checkpoints of the train state: orbax, asynchronous, atomically committed, verified.

Example:
    >>> from meltemi.levanter.checkpoint import RetentionPolicy
    >>> RetentionPolicy(save_every_steps=5).kind(10)
    'temporary'
"""

from meltemi.levanter.checkpoint._manager import (
    KINDS,
    MANIFEST,
    VERIFY_MODES,
    Checkpointer,
    CheckpointError,
    CorruptCheckpointWarning,
    RetentionPolicy,
    array_names,
    as_path,
    broadcast_from_process_0,
    checkpoint_steps,
    flatten_state,
    is_url,
    latest_complete_step,
    read_manifest,
    restore_arrays,
    step_dir,
    unflatten_state,
    verify_checkpoint,
)

__all__ = [
    "KINDS",
    "MANIFEST",
    "VERIFY_MODES",
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointWarning",
    "RetentionPolicy",
    "array_names",
    "as_path",
    "broadcast_from_process_0",
    "checkpoint_steps",
    "flatten_state",
    "is_url",
    "latest_complete_step",
    "read_manifest",
    "restore_arrays",
    "step_dir",
    "unflatten_state",
    "verify_checkpoint",
]
