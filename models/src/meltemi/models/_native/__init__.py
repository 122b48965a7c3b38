"""Native float32 kernels for decoding on the CPU, called through the XLA FFI.

* `small_matmul.cc`: a decoding step multiplies a few rows by every weight, so it is bound by
  reading the weights; XLA:CPU's dot reads them well below the machine's bandwidth at 1-8 rows
  (see the `.cc` file). `PackedLinear` holds a `Linear`'s weight in the kernel's panel layout
  and multiplies with it (decoding steps and prefill chunks alike).
* `paged_attention.cc`: the engine's attention read through its page table in place (no
  gathered copy of the pages; `paged_attention`).

Both (with `parallel.h`, their one parallel loop) are compiled on first use into one library
with the system's C++ compiler (`$CXX`, else `g++`, `c++`, `clang++`) for this machine
(`-march=native`), into a cache keyed by the sources, the compiler, the CPU's flags and the JAX
version (`$MELTEMI_KERNEL_CACHE`, else
`$XDG_CACHE_HOME/meltemi/kernels`, else `~/.cache/meltemi/kernels`); a few seconds, once.
Without a compiler, on another backend, or with `MELTEMI_NATIVE_MATMUL=0`, `available()` is
False and decoding keeps XLA (the reason is logged once).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
from meltemi.haliax.util import ensure_tuple

logger = logging.getLogger(__name__)

LANES = 16
"""Output columns per weight panel (`packed[N / LANES, K, LANES]`)."""
TARGET = "meltemi_small_matmul"
ATTENTION_TARGET = "meltemi_paged_attention"
_SOURCES = tuple(
    pathlib.Path(__file__).with_name(name) for name in ("small_matmul.cc", "paged_attention.cc")
)
_HEADERS = (pathlib.Path(__file__).with_name("parallel.h"),)  # included by the sources


def _cache_dir() -> pathlib.Path:
    if os.environ.get("MELTEMI_KERNEL_CACHE"):
        return pathlib.Path(os.environ["MELTEMI_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "meltemi" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _check_private(path: pathlib.Path) -> None:
    """Refuses a cache directory or library that another user could have written: loading a
    library runs its code."""
    if not hasattr(os, "getuid"):
        return
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(
            f"{path} is owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)}: a kernel "
            "cache must be yours and not group- or world-writable; fix it with "
            f"`chmod go-w {path}` or set MELTEMI_KERNEL_CACHE to a private directory"
        )


def _compile(compiler: str) -> pathlib.Path:
    """The kernels' shared library, compiled into the cache unless already there."""
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    sources = [path.read_bytes() for path in (*_SOURCES, *_HEADERS)]
    key = hashlib.sha256(
        b"\0".join(
            s.encode() if isinstance(s, str) else s
            for s in (*sources, version, _cpu_flags(), jax.__version__)
        )  # fmt: skip
    ).hexdigest()[:16]
    cache = _cache_dir()
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(cache)
    library = cache / f"kernels-{key}.so"
    if library.exists():
        _check_private(library)
        return library
    command = [compiler, "-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared"]
    command += ["-fPIC", "-w", "-I", jax.ffi.include_dir(), *map(str, _SOURCES)]
    with tempfile.NamedTemporaryFile(dir=cache, suffix=".so", delete=False) as tmp:
        out = pathlib.Path(tmp.name)
    try:
        subprocess.run([*command, "-o", str(out)], capture_output=True, check=True, timeout=300)
        out.chmod(0o755)  # whatever the umask: `_check_private` refuses group/world-writable
        os.replace(out, library)  # atomic: concurrent builders each write their own file
    finally:
        out.unlink(missing_ok=True)
    return library


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered (built on the first call; see the module)."""
    if os.environ.get("MELTEMI_NATIVE_MATMUL", "1") == "0":
        logger.info("native decoding matmul off (MELTEMI_NATIVE_MATMUL=0)")
        return False
    if jax.default_backend() != "cpu":
        return False
    compiler = os.environ.get("CXX") or next(
        (c for c in ("g++", "c++", "clang++") if shutil.which(c)), None
    )
    if compiler is None:
        logger.warning(
            "no C++ compiler ($CXX, g++, c++ or clang++) found: decoding on the CPU keeps "
            "XLA's product, slower at few rows; install one to build the native kernel"
        )
        return False
    try:
        library = ctypes.CDLL(str(_compile(compiler)))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        logger.warning(
            "building the native decoding kernels with %s failed (%s%s): decoding keeps XLA's "
            "product and the engine the reference paged attention",
            compiler,
            e,
            (": " + detail.decode(errors="replace")[-2000:]) if detail else "",
        )
        return False
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.MeltemiSmallMatmul), "cpu")
    jax.ffi.register_ffi_target(
        ATTENTION_TARGET, jax.ffi.pycapsule(library.MeltemiPagedAttention), "cpu"
    )
    return True


def usable() -> bool:
    """Whether decoding runs on the kernels: on a single CPU device (they are opaque to XLA's
    SPMD partitioner, so sharded models keep XLA's ops) where they build (`available`)."""
    return jax.device_count() == 1 and available()


def pack(weight: jax.Array) -> jax.Array:
    """`weight[N, K]` (output-major) as `packed[ceil(N / 16), K, 16]`, zero-padded columns."""
    n, k = weight.shape
    pad = -n % LANES
    if pad:
        weight = jnp.concatenate([weight, jnp.zeros((pad, k), weight.dtype)])
    return weight.reshape(-1, LANES, k).transpose(0, 2, 1)


def small_matmul(x: jax.Array, packed: jax.Array, n: int) -> jax.Array:
    """`x[M, K] @ weight[n, K].T` from `pack(weight)`, float32, on the kernel.

    Any `M`: each weight panel stays in cache while every block of 8 rows passes over it, so
    a prefill chunk reads the weights once too (measured beside XLA's dot on a 3072 x 768
    weight: 190-215 GFLOP/s against 118-197 from 16 to 2048 rows).
    """
    shape = jax.ShapeDtypeStruct((x.shape[0], packed.shape[0] * LANES), jnp.float32)
    out = jax.ffi.ffi_call(TARGET, shape, vmap_method="sequential")(x.astype(jnp.float32), packed)
    return out if out.shape[1] == n else out[:, :n]


def paged_attention(
    q: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    *,
    scale: float,
    softcap: float | None,
    window: int | None,
) -> jax.Array:
    """Causal attention of `q[B, T, H, G, D]` over the pages `page_table[B, NP]` lists in
    the pools `k_pool[H, P, S, D]` and `v_pool[H, P, D, S]`, on the kernel, float32; query
    `(b, t)` sees the keys at positions `<= q_positions[b, t]` (and `> q_positions[b, t] -
    window` with a window). The engine's `"native"` paged backend (see
    `meltemi.models.engine._paged_attention`, which documents the pools)."""
    return jax.ffi.ffi_call(ATTENTION_TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))(
        q.astype(jnp.float32),
        k_pool,
        v_pool,
        page_table.astype(jnp.int32),
        q_positions.astype(jnp.int32),
        scale=np.float32(scale),
        softcap=np.float32(softcap or 0.0),
        window=np.int64(window or 0),
    )


class PackedLinear(eqx.Module):
    """A float32 `haliax.nn.Linear` for decoding on the CPU: the same `In`/`Out` axes and
    result, the weight in `pack`'s panel layout (its reparameterisation scale folded in) and
    multiplied by `small_matmul`. Built by `from_linear`; only for decoding copies of a model
    (`_generate._for_decoding`), never trained."""

    packed: jax.Array
    bias: hax.NamedArray | None
    In: Any = eqx.field(static=True)
    Out: Any = eqx.field(static=True)

    @staticmethod
    def from_linear(layer: Any) -> PackedLinear:
        names = [a.name for a in hax.concat_axes(layer.Out, layer.In)]
        weight = layer.weight.rearrange(names).array.reshape(hax.axis_size(layer.Out), -1)
        scale = layer.reparam.active_scale
        if scale != 1:
            weight = weight * scale
        return PackedLinear(pack(weight), layer.bias, layer.In, layer.Out)

    def __call__(self, inputs: hax.NamedArray, *, key: jax.Array | None = None) -> hax.NamedArray:
        ins, outs = ensure_tuple(self.In), ensure_tuple(self.Out)
        names = {a.name for a in ins}
        rest = [a for a in inputs.axes if a.name not in names]
        x = inputs.rearrange([a.name for a in (*rest, *ins)]).array
        y = small_matmul(x.reshape(-1, hax.axis_size(ins)), self.packed, hax.axis_size(outs))
        out = hax.named(y.reshape(*(a.size for a in rest), *(a.size for a in outs)), (*rest, *outs))
        return out if self.bias is None else out + self.bias
