"""Test set-up: fake 8 CPU devices for the sharding tests (before jax is imported) and make
the benchmark blocks importable when running pytest straight from the source tree."""

import os
import pathlib
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

_bench = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
if _bench.is_dir() and str(_bench) not in sys.path:
    sys.path.append(str(_bench))
