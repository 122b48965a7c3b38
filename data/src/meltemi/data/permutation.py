"""Bijective index permutations of `[0, length)`, vectorised over numpy arrays.

`FeistelPermutation` is the one to use: a keyed, non-linear, alternating-radix Feistel network
on `[0, A * B)` with `A * B` just above `length`, restricted to `[0, length)` by cycle walking.
Each round is invertible (its inverse is written out below), so the network is a bijection of
`[0, A * B)`; cycle walking then restricts any bijection of a superset to a bijection of the
subset (see docs/design/data.md for the proof).
`LinearPermutation` is the affine shuffle `(a * x + b) mod length` kept for comparison only: it
is a bijection too, but consecutive inputs land a constant stride apart, so sorted data comes
out in visible phases. `EraShuffle` permutes within consecutive eras; `BlockShuffle` keeps I/O
local by permuting whole blocks and mixing only within a window of blocks.

No JAX here: the jitted twin of `FeistelPermutation` lives in `meltemi.data.on_device`.

>>> p = FeistelPermutation(10, seed=3)
>>> sorted(p(np.arange(10)).tolist()) == list(range(10))
True
>>> int(p.inverse(p(7)))
7
"""

from __future__ import annotations

import abc
import dataclasses
import math

import numpy as np

__all__ = [
    "BlockShuffle",
    "EraShuffle",
    "FeistelPermutation",
    "IndexPermutation",
    "LinearPermutation",
    "derive_seed",
]

_M64 = (1 << 64) - 1
_M32 = np.uint32(0xFFFFFFFF)
# lowbias32 (Chris Wellons' hash-prospector): a fast 32-bit mixer with low avalanche bias.
_MUL1 = np.uint32(0x7FEB352D)
_MUL2 = np.uint32(0x846CA68B)
_CHUNK = 1 << 16  # elements per numpy pass: keeps the working set in L2.
MAX_LENGTH = 1 << 62


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def derive_seed(seed: int, *salts: int) -> int:
    """Mixes `seed` with integer salts into a new 64-bit seed (splitmix64 chain).

    >>> derive_seed(0, 1) != derive_seed(0, 2)
    True
    """
    x = _splitmix64(_check_seed(seed))
    for s in salts:
        x = _splitmix64(x ^ (int(s) & _M64))
    return x


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {seed!r} of type {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed <= _M64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}; pass seed % 2**64")
    return seed


def _check_length(length: int, name: str = "length") -> int:
    if isinstance(length, bool) or not isinstance(length, int | np.integer):
        raise TypeError(f"{name} must be an int, got {length!r}")
    length = int(length)
    if not 1 <= length <= MAX_LENGTH:
        raise ValueError(f"{name} must be in [1, 2**62], got {length}")
    return length


class IndexPermutation(abc.ABC):
    """A bijection of `[0, length)`; call it on an int or an integer array."""

    length: int

    @abc.abstractmethod
    def _forward(self, x: np.ndarray) -> np.ndarray: ...

    @abc.abstractmethod
    def _inverse(self, y: np.ndarray) -> np.ndarray: ...

    def __len__(self) -> int:
        return self.length

    def __call__(self, indices: int | np.ndarray) -> np.ndarray:
        """Permuted positions of `indices` (int64, same shape)."""
        x = self._validate(indices, "indices")
        return self._forward(x.ravel()).reshape(x.shape)

    def inverse(self, positions: int | np.ndarray) -> np.ndarray:
        """The `x` with `self(x) == positions` (int64, same shape)."""
        y = self._validate(positions, "positions")
        return self._inverse(y.ravel()).reshape(y.shape)

    def _validate(self, values: int | np.ndarray, what: str) -> np.ndarray:
        arr = np.asarray(values)
        if arr.dtype.kind not in "iu":
            raise TypeError(
                f"{type(self).__name__}: {what} must be integers, got dtype {arr.dtype}"
            )
        if arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self.length:
                bad = lo if lo < 0 else hi
                raise IndexError(
                    f"{type(self).__name__}: {what} contain {bad}, outside [0, {self.length}); "
                    f"reduce them modulo the length first"
                )
        return arr.astype(np.int64, copy=False)


def _mix32(r: np.ndarray, key: np.uint32, out: np.ndarray) -> np.ndarray:
    """out = lowbias32(r ^ key): the non-linear round function on uint32 lanes."""
    np.bitwise_xor(r, key, out=out)
    np.bitwise_xor(out, out >> np.uint32(16), out=out)
    np.multiply(out, _MUL1, out=out)
    np.bitwise_xor(out, out >> np.uint32(15), out=out)
    np.multiply(out, _MUL2, out=out)
    np.bitwise_xor(out, out >> np.uint32(16), out=out)
    return out


def _mix64(r: np.ndarray, key: np.uint64, out: np.ndarray) -> np.ndarray:
    """out = splitmix64-finaliser(r ^ key): the round function on uint64 lanes."""
    np.bitwise_xor(r, key, out=out)
    np.bitwise_xor(out, out >> np.uint64(30), out=out)
    np.multiply(out, np.uint64(0xBF58476D1CE4E5B9), out=out)
    np.bitwise_xor(out, out >> np.uint64(27), out=out)
    np.multiply(out, np.uint64(0x94D049BB133111EB), out=out)
    np.bitwise_xor(out, out >> np.uint64(31), out=out)
    return out


def _reduce32(f: np.ndarray, m: np.uint32, tmp: np.ndarray) -> np.ndarray:
    """f = floor(f * m / 2**32) in place: Lemire's multiply-shift range reduction, exact in
    uint32 arithmetic for m <= 2**16 (high and low 16-bit halves), bias <= m / 2**32."""
    np.bitwise_and(f, np.uint32(0xFFFF), out=tmp)
    np.multiply(tmp, m, out=tmp)
    np.right_shift(tmp, np.uint32(16), out=tmp)
    np.right_shift(f, np.uint32(16), out=f)
    np.multiply(f, m, out=f)
    np.add(f, tmp, out=f)
    np.right_shift(f, np.uint32(16), out=f)
    return f


def _reduce64(f: np.ndarray, m: np.uint64, tmp: np.ndarray) -> np.ndarray:
    """f = f mod m in place (uint64 lanes; bias <= m / 2**64)."""
    np.floor_divide(f, m, out=tmp)
    np.multiply(tmp, m, out=tmp)
    np.subtract(f, tmp, out=f)
    return f


@dataclasses.dataclass(frozen=True)
class FeistelPermutation(IndexPermutation):
    """A keyed Feistel-network permutation of `[0, length)`.

    The network permutes `[0, A * B)` with `A = ceil(sqrt(length))`, `B = ceil(length / A)`,
    writing `x = L * B + R` with digits `L < A`, `R < B`. A round maps
    `(L, R) -> (R, (L + F_i(R)) mod A)` and swaps the radices (FF1-style alternating Feistel),
    with the non-linear `F_i(r) = reduce(lowbias32(r xor key_i), A)`, `reduce(h, m) =
    floor(h * m / 2**32)` (a 64-bit mixer and `h mod m` when `A * B > 2**32`). Since
    `A * B - length < A`, at most a `1 / sqrt(length)` fraction of the network's range lies
    outside `[0, length)`; an input landing there is walked along the network until it lands
    inside (cycle walking), which almost never takes a second step.

    Args:
        length: size of the permuted range, `1 <= length <= 2**62`.
        seed: any integer in `[0, 2**64)`; with `length` and `rounds` it determines the keys.
        rounds: Feistel rounds (at least 3; 6 by default, past the 4 that make a Luby-Rackoff
            network a strong pseudo-random permutation for random round functions).

    >>> p = FeistelPermutation(65_537, seed=0)
    >>> len(np.unique(p(np.arange(65_537))))
    65537
    >>> bool(np.all(p.inverse(p(np.arange(5))) == np.arange(5)))
    True
    """

    length: int
    seed: int = 0
    rounds: int = 6

    def __post_init__(self):
        object.__setattr__(self, "length", _check_length(self.length))
        object.__setattr__(self, "seed", _check_seed(self.seed))
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 3:
            raise ValueError(
                f"FeistelPermutation(rounds={self.rounds!r}): need an int >= 3 "
                f"(a Feistel network with fewer rounds is trivially distinguishable); "
                f"use the default rounds=6"
            )

    @property
    def radices(self) -> tuple[int, int]:
        """(A, B): the network permutes `[0, A * B)`, `x = L * B + R` with `L < A`, `R < B`."""
        a = math.isqrt(self.length - 1) + 1
        return a, -(-self.length // a)

    @property
    def wide(self) -> bool:
        """True when the network needs 64-bit lanes (`A * B > 2**32`; numpy only)."""
        a, b = self.radices
        return a * b > 1 << 32

    @property
    def keys(self) -> tuple[int, ...]:
        """The round keys (32-bit, or 64-bit when `wide`); a function of seed, length, rounds."""
        base = derive_seed(self.seed, self.length, self.rounds, 0xFE15)
        mask = _M64 if self.wide else 0xFFFFFFFF
        return tuple(_splitmix64(base + i) & mask for i in range(self.rounds))

    def _network(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        """One application of the network (or its inverse) on values in `[0, A * B)`."""
        dt = np.uint64 if self.wide else np.uint32
        mix = _mix64 if self.wide else _mix32
        reduce = _reduce64 if self.wide else _reduce32
        keys = [dt(k) for k in self.keys]
        a, b = self.radices
        # After r rounds the radices have swapped r times.
        m_left, m_right = (a, b) if not inverse or self.rounds % 2 == 0 else (b, a)
        x = x.astype(dt, copy=False)
        left = x // dt(m_right)
        right = x - left * dt(m_right)
        f = np.empty(x.shape, dt)
        q = np.empty(x.shape, dt)
        for key in reversed(keys) if inverse else keys:
            if not inverse:
                # (L, R) -> (R, (L + F(R)) mod m_left)
                m = dt(m_left)
                reduce(mix(right, key, f), m, q)
                np.add(left, f, out=left)
                # Unsigned wrap-around makes min(t, t - m) the reduction of t < 2 m mod m.
                np.subtract(left, m, out=q)
                np.minimum(left, q, out=left)
                left, right = right, left
            else:
                # (L', R') = (R, (L + F(R)) mod m) -> R = L', L = (R' - F(L')) mod m, where m is
                # the radix of R' (m_right now).
                m = dt(m_right)
                reduce(mix(left, key, f), m, q)
                np.subtract(m, f, out=f)
                np.add(right, f, out=right)  # < 2 m: no wrap-around
                np.subtract(right, m, out=q)
                np.minimum(right, q, out=right)
                left, right = right, left
            m_left, m_right = m_right, m_left
        return left * dt(m_right) + right

    def _walk(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        out = np.empty(x.shape, np.int64)
        dt = np.uint64 if self.wide else np.uint32
        last = dt(self.length - 1)
        for start in range(0, x.size, _CHUNK):
            y = self._network(x[start : start + _CHUNK], inverse)
            todo = np.flatnonzero(y > last)
            while todo.size:
                z = self._network(y[todo], inverse)
                y[todo] = z
                todo = todo[z > last]
            out[start : start + _CHUNK] = y
        return out

    def _forward(self, x: np.ndarray) -> np.ndarray:
        return self._walk(x, inverse=False)

    def _inverse(self, y: np.ndarray) -> np.ndarray:
        return self._walk(y, inverse=True)


@dataclasses.dataclass(frozen=True)
class LinearPermutation(IndexPermutation):
    """The affine shuffle `p(x) = (a * x + b) mod length` (for comparison; do not train with it).

    `a` is drawn from the seed among the units modulo `length` (so `p` is a bijection); every
    pair of consecutive inputs lands exactly `a` apart, which is what correlates batches.

    >>> p = LinearPermutation(7, seed=1)
    >>> sorted(p(np.arange(7)).tolist())
    [0, 1, 2, 3, 4, 5, 6]
    """

    length: int
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "length", _check_length(self.length))
        object.__setattr__(self, "seed", _check_seed(self.seed))

    @property
    def coefficients(self) -> tuple[int, int]:
        """(a, b) with gcd(a, length) == 1."""
        n = self.length
        if n == 1:
            return 1, 0
        x = derive_seed(self.seed, n, 0xAFF1)
        a = 1 + x % (n - 1)
        while math.gcd(a, n) != 1:
            a = a % (n - 1) + 1
        return a, derive_seed(x, 1) % n

    def _apply(self, x: np.ndarray, a: int, b: int) -> np.ndarray:
        n = self.length
        if n <= 1 << 31:  # a * x < 2**62: exact in int64.
            return (x * a + b) % n
        obj = (x.astype(object) * a + b) % n
        return obj.astype(np.int64)

    def _forward(self, x: np.ndarray) -> np.ndarray:
        a, b = self.coefficients
        return self._apply(x, a, b)

    def _inverse(self, y: np.ndarray) -> np.ndarray:
        a, b = self.coefficients
        a_inv = pow(a, -1, self.length) if self.length > 1 else 0
        return self._apply((y - b) % self.length, a_inv, 0)


@dataclasses.dataclass(frozen=True)
class EraShuffle(IndexPermutation):
    """Shuffles within consecutive eras of `era_length` indices (each with its own Feistel key).

    Index `i` stays within its era `[e * era_length, (e + 1) * era_length)`; the last era may be
    shorter. Useful when data arrives in time order and should be mixed only locally.

    >>> p = EraShuffle(10, era_length=4, seed=0)
    >>> sorted(p(np.arange(4)).tolist()), sorted(p(np.arange(8, 10)).tolist())
    ([0, 1, 2, 3], [8, 9])
    """

    length: int
    era_length: int
    seed: int = 0
    rounds: int = 6

    def __post_init__(self):
        object.__setattr__(self, "length", _check_length(self.length))
        object.__setattr__(self, "era_length", _check_length(self.era_length, "era_length"))
        object.__setattr__(self, "seed", _check_seed(self.seed))

    def _era(self, e: int) -> FeistelPermutation:
        size = min(self.era_length, self.length - e * self.era_length)
        return FeistelPermutation(size, derive_seed(self.seed, e), self.rounds)

    def _map(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        eras = x // self.era_length
        out = np.empty_like(x)
        for e in np.unique(eras).tolist():
            sel = eras == e
            perm = self._era(e)
            local = x[sel] - e * self.era_length
            mapped = perm._inverse(local) if inverse else perm._forward(local)
            out[sel] = mapped + e * self.era_length
        return out

    def _forward(self, x: np.ndarray) -> np.ndarray:
        return self._map(x, False)

    def _inverse(self, y: np.ndarray) -> np.ndarray:
        return self._map(y, True)


@dataclasses.dataclass(frozen=True)
class BlockShuffle(IndexPermutation):
    """Permutes blocks of `block_size` consecutive indices, then mixes within windows of blocks.

    The `length // block_size` full blocks are put in a Feistel order; consecutive groups of
    `window` (permuted) blocks form a window, and the indices of a window are shuffled among
    themselves. Any `window * block_size` consecutive outputs therefore touch at most `window`
    (+1) blocks of the input: random-ish order with sequential reads. The partial tail block (if
    any) joins the last window.

    >>> p = BlockShuffle(20, block_size=4, window=2, seed=0)
    >>> out = p(np.arange(8))
    >>> len(set((out // 4).tolist())) <= 2
    True
    """

    length: int
    block_size: int
    window: int = 8
    seed: int = 0
    rounds: int = 6

    def __post_init__(self):
        object.__setattr__(self, "length", _check_length(self.length))
        object.__setattr__(self, "block_size", _check_length(self.block_size, "block_size"))
        object.__setattr__(self, "window", _check_length(self.window, "window"))
        object.__setattr__(self, "seed", _check_seed(self.seed))

    @property
    def _full_blocks(self) -> int:
        return self.length // self.block_size

    @property
    def _num_windows(self) -> int:
        return max(1, -(-self._full_blocks // self.window))

    def _blocks_in(self, w: int) -> int:
        return min(self.window, self._full_blocks - w * self.window)

    def _window_perm(self, w: int) -> FeistelPermutation:
        size = self._blocks_in(w) * self.block_size
        if w == self._num_windows - 1:
            size += self.length - self._full_blocks * self.block_size
        return FeistelPermutation(size, derive_seed(self.seed, 1, w), self.rounds)

    def _block_perm(self) -> FeistelPermutation:
        return FeistelPermutation(max(1, self._full_blocks), derive_seed(self.seed, 0), self.rounds)

    def _forward(self, x: np.ndarray) -> np.ndarray:
        span = self.window * self.block_size
        bs = self.block_size
        windows = np.minimum(x // span, self._num_windows - 1)
        out = np.empty_like(x)
        blocks = self._block_perm()
        for w in np.unique(windows).tolist():
            sel = windows == w
            q = self._window_perm(w)._forward(x[sel] - w * span)
            inside = self._blocks_in(w) * bs
            res = np.empty_like(q)
            body = q < inside
            if body.any():
                slot = w * self.window + q[body] // bs
                res[body] = blocks._forward(slot) * bs + q[body] % bs
            res[~body] = self._full_blocks * bs + (q[~body] - inside)
            out[sel] = res
        return out

    def _inverse(self, y: np.ndarray) -> np.ndarray:
        bs = self.block_size
        span = self.window * bs
        tail_start = self._full_blocks * bs
        windows = np.empty_like(y)
        q = np.empty_like(y)
        tail = y >= tail_start
        last = self._num_windows - 1
        windows[tail] = last
        q[tail] = self._blocks_in(last) * bs + (y[tail] - tail_start)
        if (~tail).any():
            slot = self._block_perm()._inverse(y[~tail] // bs)
            windows[~tail] = slot // self.window
            q[~tail] = (slot % self.window) * bs + y[~tail] % bs
        out = np.empty_like(y)
        for w in np.unique(windows).tolist():
            sel = windows == w
            out[sel] = self._window_perm(w)._inverse(q[sel]) + w * span
        return out
