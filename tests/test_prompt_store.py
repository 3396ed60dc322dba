"""The prompt store: budget, eviction, per-prompt cap, statistics, and drafting from an earlier visit."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sam_rollout.drafter import (
    SOURCE_GROUP,
    SOURCE_HISTORY,
    SOURCE_NONE,
    SOURCE_STORE,
    BatchDrafter,
    DraftConfig,
    PromptStore,
)
from testkit.reference_drafter import ReferenceAutomaton, brute_force_first_draft, brute_force_frequent_draft

PROMPT_A, PROMPT_B, PROMPT_C = (np.arange(n, n + 5, dtype=np.int32) for n in (100, 200, 300))


def tokens(n, start=0):
    return np.arange(start, start + n, dtype=np.int32)


def test_stats_hits_and_misses():
    store = PromptStore(1 << 20, 1000)
    assert store.responses(PROMPT_A) == [] and store.stats().misses == 1
    store.add(PROMPT_A, tokens(10))
    store.add(PROMPT_A, tokens(20))
    got = store.responses(PROMPT_A)
    assert [r.size for r in got] == [10, 20]
    s = store.stats()
    assert (s.hits, s.offered_tokens, s.prompts, s.responses, s.tokens, s.added_responses) == (1, 30, 1, 2, 30, 2)


def test_a_trajectory_replaces_its_earlier_text():
    store = PromptStore(1 << 20, 1000)
    store.add(PROMPT_A, tokens(10))  # a sibling's response, equal to the trajectory's first turn
    store.add(PROMPT_A, tokens(10))  # the trajectory's first turn
    store.add(PROMPT_B, tokens(4))
    store.add(PROMPT_A, tokens(20), replaces=tokens(10))  # its later turn: the newest equal one goes
    store.add(PROMPT_A, tokens(3, 50), replaces=tokens(3, 60))  # nothing equal: nothing goes
    assert [r.tolist() for r in store.responses(PROMPT_A, visit=False)] == [
        tokens(10).tolist(),
        tokens(20).tolist(),
        tokens(3, 50).tolist(),
    ]
    s = store.stats()
    assert (s.responses, s.tokens, s.added_responses, s.dropped_responses) == (4, 37, 5, 0)
    assert (s.hits, s.misses, s.offered_tokens) == (0, 0, 0)  # visit=False counts nothing
    fresh = PromptStore(1 << 20, 1000)  # what is held is accounted as if only the kept ones were added
    fresh.add(PROMPT_B, tokens(4))
    for response in (tokens(10), tokens(20), tokens(3, 50)):
        fresh.add(PROMPT_A, response)
    assert store.nbytes == fresh.nbytes
    capped = PromptStore(1 << 20, 8)
    capped.add(PROMPT_A, tokens(10))
    capped.add(PROMPT_A, tokens(12), replaces=tokens(10))  # equal as added: both cut to the cap
    assert [r.tolist() for r in capped.responses(PROMPT_A)] == [tokens(8).tolist()]
    assert capped.stats().dropped_responses == 0


def test_per_prompt_cap_keeps_the_newest_and_the_beginning_of_a_long_one():
    store = PromptStore(1 << 20, 25)
    for i in range(4):
        store.add(PROMPT_A, tokens(10, 1000 * i))
    assert [int(r[0]) for r in store.responses(PROMPT_A)] == [2000, 3000]
    store.add(PROMPT_A, tokens(100, 5000))
    (only,) = store.responses(PROMPT_A)
    assert only.tolist() == list(range(5000, 5025))
    assert store.stats().tokens == 25 and store.stats().dropped_responses == 4


def test_budget_evicts_least_recently_updated_prompts():
    one = PromptStore(1 << 20, 1000)
    one.add(PROMPT_A, tokens(100))
    per_prompt = one.nbytes
    store = PromptStore(2 * per_prompt + 200, 1000)  # room for two prompts and one more short response
    store.add(PROMPT_A, tokens(100))
    store.add(PROMPT_B, tokens(100))
    store.add(PROMPT_A, tokens(1))  # A is now the most recently updated
    store.add(PROMPT_C, tokens(100))
    assert store.responses(PROMPT_B) == [] and len(store.responses(PROMPT_A)) == 2
    assert store.stats().evicted_prompts == 1 and store.nbytes <= store.budget_bytes


def test_nbytes_covers_what_is_held():
    """The accounted bytes are at least what Python allocates for the entries (tracemalloc)."""
    store = PromptStore(1 << 30, 4096)
    rng = np.random.default_rng(0)
    responses = [rng.integers(0, 150000, size=int(rng.integers(50, 3000)), dtype=np.int32) for _ in range(300)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, response in enumerate(responses):
        store.add(np.array([i % 60, 7], dtype=np.int32), response)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert held <= store.nbytes <= 1.1 * held + 4096


def test_bad_arguments():
    with pytest.raises(ValueError, match="budget_bytes"):
        PromptStore(0, 10)
    with pytest.raises(ValueError, match="prompt_store_bytes"):
        DraftConfig(prompt_store=True, prompt_store_bytes=0)
    with pytest.raises(ValueError, match="prompt_store_tokens"):
        DraftConfig(prompt_store_tokens=0)


def visit(drafter, prompt, responses, tag):
    """One visit of a prompt: its requests start together, generate, and finish."""
    ids = [(tag, i) for i in range(len(responses))]
    for req_id in ids:
        drafter.start(req_id, prompt, group=tag)
    for req_id, response in zip(ids, responses):
        drafter.extend([req_id], response, [len(response)])
    for req_id in ids:
        drafter.finish(req_id)


def test_next_visit_drafts_from_the_previous_one():
    response = tokens(50, 1000)
    for continuation in ("first", "frequent", "adaptive"):
        drafter = BatchDrafter(DraftConfig(prompt_store=True, continuation=continuation))
        visit(drafter, PROMPT_A, [response], "step-1")
        drafter.start("again", PROMPT_A, group="step-36")
        p = drafter.propose(["again"])
        assert p.tokens[0].tolist() == response[:3].tolist() and p.sources[0] == SOURCE_STORE
        drafter.finish("again")
        assert drafter.prompt_store.stats().hits == 1
    off = BatchDrafter(DraftConfig())
    visit(off, PROMPT_A, [response], "step-1")
    off.start("again", PROMPT_A, group="step-36")
    assert off.propose(["again"]).lengths[0] == 0 and off.prompt_store is None


def test_stored_responses_are_freed_with_their_group():
    drafter = BatchDrafter(DraftConfig(prompt_store=True))
    visit(drafter, PROMPT_A, [tokens(500)], "v1")
    empty = drafter.nbytes
    drafter.start("r", PROMPT_A, group="v2")
    assert drafter.nbytes > empty + 500 * 20
    drafter.finish("r")
    assert drafter.nbytes == empty


SOURCE_OF = {None: SOURCE_NONE, 0: SOURCE_GROUP, 1: SOURCE_STORE, 2: SOURCE_HISTORY}


def prompt_with_responses(prompt, responses) -> ReferenceAutomaton:
    ref = ReferenceAutomaton()
    shared = ref.add_member()
    for token in prompt:
        ref.append(shared, token)
    for response in responses:
        member = ref.add_member(shared)
        for token in response:
            ref.append(member, token)
    return ref


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), continuation=st.sampled_from(["first", "frequent"]))
def test_store_source_matches_definition(data, continuation):
    """A revisit drafts from the group (its own visit) and the stored responses (the earlier visit)
    exactly as the definitions over those two sources say."""
    sym = st.integers(0, data.draw(st.integers(2, 4)) - 1)
    prompt = data.draw(st.lists(sym, min_size=1, max_size=6))
    earlier = data.draw(st.lists(st.lists(sym, min_size=1, max_size=25), min_size=1, max_size=3))
    steps = data.draw(st.lists(sym, min_size=1, max_size=40))
    config = DraftConfig(k=3, group_aware=True, continuation=continuation, prompt_store=True)
    drafter = BatchDrafter(config)
    visit(drafter, prompt, earlier, "earlier")
    stored = prompt_with_responses(prompt, earlier)
    drafter.start("r", prompt, group="now")
    group = prompt_with_responses(prompt, [])
    member = group.add_member(0)
    text = list(prompt)
    for token in steps:
        drafter.extend(["r"], [token], [1])
        group.append(member, token)
        text.append(token)
        if continuation == "first":
            want = brute_force_first_draft([group, stored], text, 3)
        else:
            want = brute_force_frequent_draft(
                [group, stored],
                text,
                3,
                prior=config.count_prior,
                long_match=config.long_match,
                recency_weight=config.recency_weight,
            )
        p = drafter.propose(["r"])
        got = p.tokens[0, : p.lengths[0]].tolist(), int(p.match_lengths[0]), int(p.sources[0])
        assert got == (want[0], want[1], SOURCE_OF[want[2] if want[0] else None])


def test_a_handoff_copies_a_prompts_responses_to_another_store():
    """export -> encode -> decode -> import: the other store drafts as the first would; the cap and
    duplicates hold, and a lookup counts no visit on the exporting store."""
    from sam_rollout.drafter.prompt_store import decode_entries, encode_entries, prompt_key

    source, target = PromptStore(1 << 20, 30), PromptStore(1 << 20, 30)
    source.add(PROMPT_A, tokens(10))
    source.add(PROMPT_A, tokens(12, 50))
    source.add(PROMPT_B, tokens(4))
    target.add(PROMPT_A, tokens(10))  # an older visit's copy already here
    target.add(PROMPT_A, tokens(9, 90))
    wire = encode_entries(source.export([prompt_key(PROMPT_A), prompt_key(PROMPT_C)]))
    assert list(wire) == [prompt_key(PROMPT_A).hex()]
    assert all(isinstance(r, bytes) for r in wire[prompt_key(PROMPT_A).hex()])
    assert target.import_entries(decode_entries(wire)) == 1  # tokens(10) was there already
    got = target.responses(PROMPT_A)
    # the imported ones are the newest; over the cap of 30 the oldest (the 9 tokens) went
    assert [r.tolist() for r in got] == [tokens(10).tolist(), tokens(12, 50).tolist()]
    s, t = source.stats(), target.stats()
    assert (s.hits, s.misses, s.exported_prompts) == (0, 0, 1)
    assert (t.imported_responses, t.tokens, t.responses) == (1, 22, 2)


def test_an_import_keeps_the_cap_and_the_budget():
    from sam_rollout.drafter.prompt_store import prompt_key

    target = PromptStore(1 << 20, 25)
    target.import_entries({prompt_key(PROMPT_A): [tokens(10), tokens(10, 100), tokens(40, 200)]})
    got = target.responses(PROMPT_A)
    assert [r.size for r in got] == [25]  # the newest, cut to its beginning, as add keeps it
    assert got[0].tolist() == tokens(25, 200).tolist()
    small = PromptStore(3000, 1000)
    for i in range(10):
        small.import_entries({prompt_key(tokens(5, 1000 * i)): [tokens(100)]})
    assert small.nbytes <= 3000 and small.stats().evicted_prompts > 0


def test_malformed_handoff_entries_are_refused():
    from sam_rollout.drafter.prompt_store import decode_entries

    with pytest.raises(ValueError, match="malformed"):
        decode_entries({"ab": [b"\0\0\0\0"]})
    with pytest.raises(ValueError, match="malformed"):
        decode_entries({"00" * 16: [b"\0\0\0"]})
    with pytest.raises(ValueError, match="16 bytes"):
        PromptStore(1 << 20, 10).import_entries({b"short": [tokens(3)]})
