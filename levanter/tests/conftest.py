"""Shared test set-up: a persistent compilation cache, so identical programs compile once."""

import os
import tempfile

import jax

jax.config.update(
    "jax_compilation_cache_dir",
    os.path.join(os.environ.get("TEST_TMPDIR", tempfile.gettempdir()), "jax_cache"),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
