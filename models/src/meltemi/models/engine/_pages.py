"""Host-side page bookkeeping: a free list with reference counts over the KV pool's pages."""

from __future__ import annotations

import numpy as np

NULL_PAGE = 0
"""Reserved page: padding tokens write their keys here and empty page-table entries point
here; it is never handed out, and nothing reads it unmasked."""


class PageAllocator:
    """Pages `1 .. num_pages - 1` of a pool, each free or held by one or more sequences.

    A page held by several sequences (a prompt's full pages shared by its `n` samples) is freed
    when the last holder releases it. Freed pages go back on the free list and are handed out
    again (most recently freed first).

    >>> pages = PageAllocator(5)
    >>> a = pages.alloc(2); pages.share(a); pages.num_free
    2
    >>> pages.release(a); pages.num_free
    2
    >>> pages.release(a); pages.num_free
    4
    """

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"PageAllocator needs >= 2 pages (one is reserved), got {num_pages}")
        self.num_pages = num_pages
        self.refcount = np.zeros(num_pages, np.int32)
        self._free = list(range(num_pages - 1, NULL_PAGE, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        """Pages not held by any sequence."""
        return len(self._free)

    @property
    def capacity(self) -> int:
        """Pages that can be handed out (all but the reserved one)."""
        return self.num_pages - 1

    def alloc(self, n: int) -> list[int]:
        """`n` free pages, each now held once. Raises `MemoryError` if fewer are free (the
        engine checks `num_free` before admitting, so this means a bookkeeping bug)."""
        if n > len(self._free):
            raise MemoryError(f"alloc({n}) with {len(self._free)} free pages")
        out = [self._free.pop() for _ in range(n)]
        self.refcount[out] = 1
        return out

    def share(self, pages: list[int]) -> None:
        """One more holder of each of `pages`."""
        for p in pages:
            if self.refcount[p] < 1:
                raise ValueError(f"share of page {p}, which is free")
            self.refcount[p] += 1

    def release(self, pages: list[int]) -> None:
        """One holder fewer of each of `pages`; a page nobody holds is free again."""
        for p in pages:
            if self.refcount[p] < 1:
                raise ValueError(f"release of page {p}, which is already free")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self._free.append(p)
