"""The prompt store's file (docs/prompt-store.md): round trip, a smaller budget or cap against brute
force, damaged files (every byte), and a stepper that resumes drafting from a saved store."""

import logging
import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sam_rollout.drafter import SOURCE_STORE, BatchDrafter, DraftConfig, PromptStore
from sam_rollout.drafter import prompt_store as ps
from sam_rollout.metrics import SamStepTracker
from sam_rollout.settings import SamSettings
from sam_rollout.stepper import SamStepper

BIG = 1 << 30


def contents(store):
    return [(key, [r.tolist() for r in responses]) for key, responses in store.items()]


def filled_store(visits, budget=BIG, cap=1000):
    """A store after `visits`: (prompt id, response length, first token) in order."""
    store = PromptStore(budget, cap)
    for prompt, length, first in visits:
        store.add(np.array([prompt, 7, prompt], dtype=np.int32), np.arange(first, first + length, dtype=np.int32))
    return store


visits_strategy = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 40), st.integers(0, 100_000)), min_size=0, max_size=30
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(visits=visits_strategy, cap=st.integers(1, 60))
def test_round_trip_keeps_contents_order_and_holdings(tmp_path, visits, cap):
    store = filled_store(visits, cap=cap)
    store.responses(np.array([0, 7, 0], dtype=np.int32))  # a hit or a miss, not kept in the file
    path = str(tmp_path / "store.npz")
    assert store.save(path) == os.path.getsize(path)
    loaded, problem = PromptStore.load(path, BIG, cap)
    assert problem is None
    assert contents(loaded) == contents(store)
    before, after = store.stats(), loaded.stats()
    holdings = ("prompts", "responses", "tokens", "nbytes")
    assert [getattr(after, f) for f in holdings] == [getattr(before, f) for f in holdings]
    assert (after.hits, after.misses, after.offered_tokens, after.added_responses) == (0, 0, 0, 0)
    assert (after.evicted_prompts, after.dropped_responses) == (0, 0)
    with np.load(path) as npz:  # a plain .npz: numpy reads every array
        assert int(npz["format_version"]) == ps.FORMAT_VERSION
        assert (int(npz["budget_bytes"]), int(npz["tokens_per_prompt"])) == (BIG, cap)
        flat = [t for _, responses in contents(store) for r in responses for t in r]
        assert npz["tokens"].tolist() == flat and npz["keys"].shape == (len(store), ps.KEY_BYTES)


def fitted(store, budget, cap):
    """Brute force: per prompt, each response cut to `cap` and the newest that fit it; then the newest
    prompts whose bytes fit `budget`."""
    prompts = []
    for key, responses in contents(store):
        cut = [r[:cap] for r in responses]
        kept = next(cut[i:] for i in range(len(cut) + 1) if sum(map(len, cut[i:])) <= cap)
        nbytes = len(key) + ps.ENTRY_OVERHEAD_BYTES + sum(ps.RESPONSE_OVERHEAD_BYTES + 4 * len(r) for r in kept)
        prompts.append((key, kept, nbytes))
    first = next(i for i in range(len(prompts) + 1) if sum(n for _, _, n in prompts[i:]) <= budget)
    return [(key, kept) for key, kept, _ in prompts[first:]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(visits=visits_strategy, cap=st.integers(1, 60), budget=st.integers(1, 4000))
@example(visits=[(0, 1, 0)] * 3, cap=3, budget=540)  # one prompt over the budget: it goes whole
def test_smaller_budget_or_cap_keeps_what_brute_force_says(tmp_path, visits, cap, budget):
    store = filled_store(visits, cap=60)
    path = str(tmp_path / "store.npz")
    store.save(path)
    loaded, problem = PromptStore.load(path, budget, cap)
    assert problem is None
    want = fitted(store, budget, cap)
    assert contents(loaded) == want
    assert loaded.nbytes <= budget and loaded.stats().prompts == len(want)
    stats = loaded.stats()
    assert stats.evicted_prompts == len(store) - len(want)
    assert stats.dropped_responses == store.stats().responses - sum(len(kept) for _, kept in want)


def small_saved_store(tmp_path):
    store = filled_store([(1, 5, 10), (2, 3, 20), (1, 4, 30), (3, 6, 40)])
    path = str(tmp_path / "store.npz")
    store.save(path)
    return store, path


def assert_unused(path, reason, caplog, *, budget=BIG):
    with caplog.at_level(logging.WARNING, logger="sam_rollout.drafter.prompt_store"):
        loaded, problem = PromptStore.load(path, budget, 1000)
    assert len(loaded) == 0 and loaded.nbytes == 0
    assert problem is not None and path in problem and reason in problem
    assert problem in caplog.text


def array_bytes(path) -> set[int]:
    """Offsets of the bytes of every array in the file (each member's data: .npy header and values)."""
    raw = Path(path).read_bytes()
    out = set()
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name_length, extra_length = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
            start = info.header_offset + 30 + name_length + extra_length
            out |= set(range(start, start + info.compress_size))
    return out


def test_every_damaged_byte_gives_the_same_store_or_an_empty_one(tmp_path, caplog):
    """Flip each byte of a saved file in turn: the load never raises and never returns other contents,
    and a damaged byte of any array always empties it (zip's CRC covers the arrays; what is left is
    zip bookkeeping that zipfile reads without checking, such as dates)."""
    store, path = small_saved_store(tmp_path)
    data = Path(path).read_bytes()
    arrays = array_bytes(path)
    damaged = str(tmp_path / "damaged.npz")
    unused = set()
    for i in range(len(data)):
        with open(damaged, "wb") as f:
            f.write(data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1 :])
        loaded, problem = PromptStore.load(damaged, BIG, 1000)
        if problem is None:
            assert contents(loaded) == contents(store), f"byte {i}"
        else:
            assert len(loaded) == 0 and damaged in problem, f"byte {i}"
            unused.add(i)
    assert arrays <= unused and len(arrays) > len(data) / 2


@pytest.mark.parametrize("keep", [0, 22, 100, -30, -1])
def test_a_truncated_file_is_not_used(tmp_path, caplog, keep):
    _, path = small_saved_store(tmp_path)
    data = Path(path).read_bytes()
    with open(path, "wb") as f:
        f.write(data[:keep])
    assert_unused(path, "not used", caplog)


def test_another_format_version_is_not_used(tmp_path, caplog, monkeypatch):
    store = filled_store([(1, 5, 10)])
    path = str(tmp_path / "store.npz")
    monkeypatch.setattr(ps, "FORMAT_VERSION", 2)
    store.save(path)
    monkeypatch.undo()
    assert_unused(path, "format version 2; this code reads version 1", caplog)


def test_a_missing_file_or_another_npz_is_not_used(tmp_path, caplog):
    assert_unused(str(tmp_path / "absent.npz"), "no such file", caplog)
    other = str(tmp_path / "other.npz")
    np.savez(other, tokens=np.arange(3))
    assert_unused(other, "not a SAM prompt store file", caplog)


def test_a_failed_save_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    store, path = small_saved_store(tmp_path)
    before = Path(path).read_bytes()

    def fail_midway(self, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(PromptStore, "_write", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        filled_store([(9, 9, 9)]).save(path)
    assert Path(path).read_bytes() == before and os.listdir(tmp_path) == ["store.npz"]


def test_save_makes_the_folder(tmp_path):
    path = str(tmp_path / "global_step_3" / "sam_prompt_store" / "rollout_0.npz")
    filled_store([(1, 2, 3)]).save(path)
    assert contents(PromptStore.load(path, BIG, 1000)[0]) == contents(filled_store([(1, 2, 3)]))


def test_drafter_loads_only_with_the_store_on(tmp_path):
    with pytest.raises(ValueError, match="DraftConfig.prompt_store"):
        BatchDrafter(DraftConfig()).load_prompt_store(str(tmp_path / "x.npz"))


# -- through a stepper: a revisit after a restart drafts from the saved responses ------------------
WIDTH = 128
PROMPTS = {"p": np.array([3, 1, 4, 1, 5], dtype=np.int32), "q": np.array([2, 7, 1, 8], dtype=np.int32)}
RESPONSES = {"p": np.arange(1000, 1040, dtype=np.int32), "q": np.arange(2000, 2030, dtype=np.int32)}


def store_settings(**kw):
    return SamSettings.from_mapping(3, {"prompt_store": True, "switch": None, **kw})


def run_visit(stepper, tag, siblings=2):
    """Siblings of each prompt start, generate their prompt's response in full, and finish."""
    req_ids = [f"{tag}-{name}-{s}" for name in PROMPTS for s in range(siblings)]
    prompts = [PROMPTS[name] for name in PROMPTS for _ in range(siblings)]
    responses = [RESPONSES[name] for name in PROMPTS for _ in range(siblings)]
    rows = np.zeros((len(req_ids), WIDTH), dtype=np.int32)
    npt = np.array([len(p) for p in prompts], dtype=np.int32)
    lengths = npt.copy()
    for i, p in enumerate(prompts):
        rows[i, : len(p)] = p
    first_drafts = None
    for t in range(max(len(r) for r in responses)):
        sampled = []
        for i, r in enumerate(responses):
            token = [int(r[t])] if t < len(r) else []
            rows[i, lengths[i] : lengths[i] + len(token)] = token
            lengths[i] += len(token)
            sampled.append(token)
        drafts = stepper.step(req_ids, npt, sampled, lengths, rows)
        first_drafts = drafts if first_drafts is None else first_drafts
    for rid in req_ids:
        stepper.finish(rid)
    return dict(zip(req_ids, first_drafts))


def test_a_saved_store_lets_the_next_engine_draft_a_revisit(tmp_path):
    path = str(tmp_path / "sam_prompt_store" / "rollout_0.npz")
    before = SamStepper(store_settings(), max_model_len=WIDTH)
    run_visit(before, "v1")
    assert before.metrics.started_with_store == 0
    before.drafter.prompt_store.save(path)

    after = SamStepper(store_settings(), max_model_len=WIDTH)  # a restarted engine
    assert after.drafter.load_prompt_store(path) is None
    assert contents(after.drafter.prompt_store) == contents(before.drafter.prompt_store)
    tracker = SamStepTracker()
    tracker.step_metrics({"rollout_0": after.snapshot()})
    drafts = run_visit(after, "v2", siblings=3)
    for rid, draft in drafts.items():  # the first step already drafts the saved response's beginning
        name = rid.split("-")[1]
        assert draft == RESPONSES[name][1:4].tolist(), rid
    assert after.drafter.start("probe", PROMPTS["p"], group="probe")  # the drafts' source: the store
    assert after.drafter.propose(["probe"]).sources[0] == SOURCE_STORE
    after.drafter.finish("probe", keep=False)
    assert after.metrics.started_with_store == 6 and after.metrics.started == 6
    step = tracker.step_metrics({"rollout_0": after.snapshot()})
    assert step["rollout/sam_requests_with_store"] == 6.0 and step["rollout/sam_requests_started"] == 6.0


def test_requests_with_store_counts_only_revisits():
    stepper = SamStepper(store_settings(), max_model_len=WIDTH)
    tracker = SamStepTracker()
    run_visit(stepper, "v1")
    first = tracker.step_metrics({"e": stepper.snapshot()})
    run_visit(stepper, "v2")
    second = tracker.step_metrics({"e": stepper.snapshot()})
    assert first["rollout/sam_requests_with_store"] == 0.0 and second["rollout/sam_requests_with_store"] == 4.0
    off = SamStepper(SamSettings.from_mapping(3, {"switch": None}), max_model_len=WIDTH)
    run_visit(off, "v1")
    run_visit(off, "v2")
    assert off.snapshot()["requests_with_store"] == 0
