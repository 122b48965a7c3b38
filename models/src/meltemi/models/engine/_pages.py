"""Host-side page bookkeeping: a free list with reference counts over the KV pool's pages, and
the prefix cache (full pages of finished work kept, by their tokens, until the space is needed).
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Sequence

import numpy as np

NULL_PAGE = 0
"""Reserved page: padding tokens write their keys here and empty page-table entries point
here; it is never handed out, and nothing reads it unmasked."""


def page_keys(tokens: np.ndarray, page_size: int, parent: bytes = b"") -> list[bytes]:
    """Keys of the full pages of `tokens` (a sequence's tokens from a page boundary on, after
    the pages whose last key is `parent`): each page's key digests its tokens and the key
    before it, so a key names the whole prefix up to the end of its page.

    >>> a = page_keys(np.arange(10, dtype=np.int32), 4)
    >>> len(a), a == page_keys(np.arange(9, dtype=np.int32), 4)
    (2, True)
    >>> page_keys(np.arange(4, 8, dtype=np.int32), 4, parent=a[0]) == a[1:]
    True
    """
    tokens = np.asarray(tokens, np.int32)
    keys = []
    for start in range(0, tokens.size - page_size + 1, page_size):
        parent = hashlib.blake2b(
            parent + tokens[start : start + page_size].tobytes(), digest_size=16
        ).digest()
        keys.append(parent)
    return keys


class PageAllocator:
    """Pages `1 .. num_pages - 1` of a pool, each free or held by one or more sequences.

    A page held by several sequences (a prompt's full pages shared by its `n` samples) is freed
    when the last holder releases it. Freed pages go back on the free list and are handed out
    again (most recently freed first).

    Prefix cache: a page `register`ed under a key (`page_keys`) is findable by `match` while it
    is held and after its last holder releases it; `claim` holds it again. Released cached pages
    count as free: `alloc` takes them, least recently released first, once the free list is
    empty, and forgets their keys.

    >>> pages = PageAllocator(5)
    >>> a = pages.alloc(2); pages.share(a); pages.num_free
    2
    >>> pages.release(a); pages.num_free
    2
    >>> pages.release(a); pages.num_free
    4
    >>> b = pages.alloc(1); pages.register(b[0], b"k"); pages.release(b)
    >>> pages.num_free, pages.match([b"k", b"other"]) == b
    (4, True)
    """

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"PageAllocator needs >= 2 pages (one is reserved), got {num_pages}")
        self.num_pages = num_pages
        self.refcount = np.zeros(num_pages, np.int32)
        self._free = list(range(num_pages - 1, NULL_PAGE, -1))  # pop() hands out low ids first
        self._page_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()

    @property
    def num_free(self) -> int:
        """Pages not held by any sequence (cached or not)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        """Pages findable by `match` (held or not)."""
        return len(self._key_of)

    @property
    def capacity(self) -> int:
        """Pages that can be handed out (all but the reserved one)."""
        return self.num_pages - 1

    def alloc(self, n: int) -> list[int]:
        """`n` free pages, each now held once (uncached ones first, then the least recently
        released cached ones, whose keys are dropped). Raises `MemoryError` if fewer are free
        (the engine checks `num_free` before admitting, so this means a bookkeeping bug)."""
        if n > self.num_free:
            raise MemoryError(f"alloc({n}) with {self.num_free} free pages")
        out = []
        for _ in range(n):
            if self._free:
                out.append(self._free.pop())
            else:
                page, _ = self._evictable.popitem(last=False)
                del self._page_of[self._key_of.pop(page)]
                out.append(page)
        self.refcount[out] = 1
        return out

    def share(self, pages: Sequence[int]) -> None:
        """One more holder of each of `pages`."""
        for p in pages:
            if self.refcount[p] < 1:
                raise ValueError(f"share of page {p}, which is free")
            self.refcount[p] += 1

    def release(self, pages: Sequence[int]) -> None:
        """One holder fewer of each of `pages`; a page nobody holds is free again (kept
        findable if it is cached)."""
        for p in pages:
            if self.refcount[p] < 1:
                raise ValueError(f"release of page {p}, which is already free")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                if p in self._key_of:
                    self._evictable[p] = None
                else:
                    self._free.append(p)

    # -- prefix cache --------------------------------------------------------------------------
    def register(self, page: int, key: bytes) -> None:
        """Makes held `page` findable under `key` (its tokens' `page_keys` entry). A key already
        cached keeps its page; a page already cached keeps its key."""
        if self.refcount[page] < 1:
            raise ValueError(f"register of page {page}, which is free")
        if key not in self._page_of and page not in self._key_of:
            self._page_of[key] = page
            self._key_of[page] = key

    def match(self, keys: Sequence[bytes]) -> list[int]:
        """The cached pages of the longest prefix of `keys` (nothing is held yet: `claim`)."""
        out = []
        for key in keys:
            page = self._page_of.get(key)
            if page is None:
                break
            out.append(page)
        return out

    def num_unheld(self, pages: Sequence[int]) -> int:
        """How many of `pages` nobody holds (claiming them takes that many from `num_free`)."""
        return sum(int(self.refcount[p] == 0) for p in pages)

    def claim(self, pages: Sequence[int]) -> None:
        """One more holder of each of `pages` (from `match`), cached and possibly released."""
        for p in pages:
            if self.refcount[p] == 0:
                del self._evictable[p]
            self.refcount[p] += 1

    def clear_cache(self) -> None:
        """Forgets every key (after new weights, cached keys and values are stale): released
        cached pages go back on the free list, held ones stay with their holders."""
        self._free.extend(reversed(self._evictable))
        self._evictable.clear()
        self._page_of.clear()
        self._key_of.clear()
