"""sam_rollout.drafter.pages: large automaton arrays in 2 MiB-aligned mappings advised for huge pages, small ones from
numpy; drafts are the same either way."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from sam_rollout.drafter import BatchDrafter, DraftConfig, pages

MIB = 1 << 20
needs_madvise = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")


def test_advised_bytes_are_whole_chunks_and_a_last_one_at_least_three_quarters_full():
    assert pages.advised_bytes(MIB) == 0
    assert pages.advised_bytes(int(1.5 * MIB)) == 2 * MIB
    assert pages.advised_bytes(2 * MIB) == 2 * MIB
    assert pages.advised_bytes(3 * MIB) == 2 * MIB  # a half-full last chunk stays in small pages
    assert pages.advised_bytes(int(3.5 * MIB)) == 4 * MIB


def test_small_arrays_are_plain_numpy():
    a = pages.int32_array(1000)
    assert a.dtype == np.int32 and a.size == 1000 and a.base is None


@needs_madvise
def test_a_large_array_starts_on_a_huge_page_and_holds_its_values():
    n = (3 * MIB) // 4  # 3 MiB
    a = pages.int32_array(n)
    assert a.dtype == np.int32 and a.size == n and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % pages.HUGE_PAGE == 0
    a[:] = np.arange(n, dtype=np.int32)
    assert int(a[-1]) == n - 1 and int(a.sum(dtype=np.int64)) == n * (n - 1) // 2


def test_the_switch_off_gives_plain_numpy(monkeypatch):
    monkeypatch.setenv(pages.DISABLE_ENV, "0")
    a = pages.int32_array(MIB)
    assert a.size == MIB and a.base is None and not pages.huge_pages_enabled()


@needs_madvise
@pytest.mark.parametrize("continuation", ["first", "adaptive"])
def test_drafts_are_the_same_with_and_without_huge_pages(monkeypatch, continuation):
    """A 150k-token text: its arrays are large enough for huge pages, and the steps grow them."""
    rng = np.random.default_rng(0)
    text = rng.integers(0, 50, size=150_000).astype(np.int32)
    text[50_000:100_000] = text[:50_000]  # long repeats, so that drafts are not empty
    drafts = {}
    for setting in ("0", "1"):
        monkeypatch.setenv(pages.DISABLE_ENV, setting)
        drafter = BatchDrafter(DraftConfig(group_aware=False, continuation=continuation))
        drafter.start("r", text[:120_000])
        arrays = [a for per_automaton in drafter._automata.arrays for a in per_automaton]
        mapped = [a.ctypes.data % pages.HUGE_PAGE == 0 and a.base is not None for a in arrays]
        assert any(mapped) if setting == "1" else not any(mapped)
        out = []
        for length in range(120_001, 120_400):
            out.append(drafter.step(["r"], text[None, :], [length], 3).tokens[0].tolist())
        drafts[setting] = out
    assert drafts["0"] == drafts["1"]
    assert sum(d[0] >= 0 for d in drafts["1"]) > 100
