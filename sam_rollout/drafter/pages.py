"""Memory for the automata's int32 arrays: large ones in 2 MiB chunks the kernel may back with huge pages.

A drafting step touches every running request's automaton, one after another: 64 automata of a few MiB
each at 32k tokens of context. With 4 KiB pages most of those scattered reads also miss the TLB. Arrays
of whole 2 MiB chunks, and a last chunk at least ``HUGE_FILL`` full, are mapped privately at a 2 MiB
boundary and advised ``MADV_HUGEPAGE`` (Linux, with transparent huge pages in "madvise" or "always"
mode): a huge page is resident as a whole, so at most a quarter of one is resident beyond the array. Smaller
arrays, platforms without ``MADV_HUGEPAGE``, and ``SAM_HUGE_PAGES=0`` get plain numpy arrays. Values
and drafts are the same either way; the measured gain is in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

HUGE_PAGE = 2 << 20
HUGE_FILL = 0.75  # a last, partial 2 MiB chunk this full is advised too
DISABLE_ENV = "SAM_HUGE_PAGES"


def advised_bytes(nbytes: int) -> int:
    """Bytes of an array of `nbytes` to advise for huge pages: its whole 2 MiB chunks, plus the last
    partial one when it is at least HUGE_FILL full."""
    whole, tail = divmod(nbytes, HUGE_PAGE)
    return (whole + (tail >= HUGE_FILL * HUGE_PAGE)) * HUGE_PAGE


def huge_pages_enabled() -> bool:
    return hasattr(mmap, "MADV_HUGEPAGE") and os.environ.get(DISABLE_ENV, "1") != "0"


def int32_array(n: int) -> np.ndarray:
    """An uninitialised int32 array of n elements (see the module's docstring for where it lives)."""
    nbytes = 4 * n
    advised = advised_bytes(nbytes)
    if advised == 0 or not huge_pages_enabled():
        return np.empty(n, dtype=np.int32)
    # room to start at a 2 MiB boundary and to advise a last chunk beyond nbytes (virtual until touched)
    region = mmap.mmap(-1, max(advised, nbytes) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(region, dtype=np.uint8)  # keeps the mapping alive as long as the array
    start = -raw.ctypes.data % HUGE_PAGE
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages: plain pages, same values
        region.madvise(mmap.MADV_HUGEPAGE, start, advised)
    return raw[start : start + nbytes].view(np.int32)
