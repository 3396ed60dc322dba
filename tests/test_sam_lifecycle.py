"""Request life cycle, memory, policies and bad input of the batch drafter."""

import numpy as np
import pytest

from sam_rollout.drafter import SOURCE_GROUP, SOURCE_HISTORY, SOURCE_NONE, BatchDrafter, DraftConfig, SuffixAutomaton


def repetitive(n, seed=0, alphabet=50):
    rng = np.random.default_rng(seed)
    out = list(rng.integers(0, alphabet, size=64))
    while len(out) < n:
        start = int(rng.integers(0, len(out) - 20))
        out += out[start : start + int(rng.integers(4, 20))] + [int(rng.integers(0, alphabet))]
    return np.array(out[:n], dtype=np.int32)


# ---------------------------------------------------------------- the single-stream API ------------
def test_suffix_automaton_api():
    sa = SuffixAutomaton([1, 2, 3, 1, 2])
    assert len(sa) == 5
    assert sa.draft(3).tolist() == [3, 1, 2]
    assert sa.match_length == 2
    assert sa.draft(1).tolist() == [3]
    assert sa.draft(0).tolist() == []
    sa.extend(np.array([9], dtype=np.int64))
    assert sa.draft(3).tolist() == [] and sa.match_length == 0
    assert sa.nbytes > 0
    assert SuffixAutomaton().draft(3).tolist() == []


def test_draft_never_exceeds_k_or_the_text():
    sa = SuffixAutomaton([5, 6, 5])
    assert sa.draft(10).tolist() == [6, 5]  # only what followed the first 5


# ---------------------------------------------------------------- life cycle and memory ------------
def test_finish_frees_everything():
    drafter = BatchDrafter(DraftConfig(group_aware=True))
    empty = drafter.nbytes
    for i in range(8):
        drafter.start(i, [1, 2, 3], group="p")
        drafter.extend([i], repetitive(2000, seed=i), [2000])
    assert drafter.nbytes > empty + 8 * 2000 * 20
    for i in range(8):
        drafter.finish(i)
    assert len(drafter) == 0
    assert drafter.nbytes == empty
    with pytest.raises(KeyError, match="unknown request 3"):
        drafter.extend([3], [1], [1])


def test_group_outlives_finished_siblings():
    """A sibling's text stays a draft source until the last sibling of its group finishes."""
    drafter = BatchDrafter(DraftConfig(group_aware=True))
    drafter.start("a", [7], group=1)
    drafter.start("b", [7], group=1)
    drafter.extend(["a"], [1, 2, 3, 4], [4])
    drafter.finish("a")
    drafter.extend(["b"], [1, 2], [2])
    proposal = drafter.propose(["b"], 3)
    assert proposal.tokens[0].tolist() == [3, 4, -1]
    assert proposal.sources[0] == SOURCE_GROUP


def test_memory_per_token_is_bounded():
    drafter = BatchDrafter(DraftConfig(group_aware=False))
    drafter.start(0, repetitive(30000, seed=4, alphabet=30000))
    assert drafter.nbytes / 30000 < 80  # the benchmark reports the exact figure


def test_slots_and_automata_are_reused():
    drafter = BatchDrafter(DraftConfig())
    for round_ in range(3):
        for i in range(40):
            drafter.start((round_, i), repetitive(100, seed=i))
        for i in range(40):
            drafter.finish((round_, i))
    assert drafter._cursor.shape[0] == 64
    assert len(drafter._automata.arrays) == 40


# ---------------------------------------------------------------- policies -------------------------
def test_min_match_and_scaled_length():
    text = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4]
    fixed = BatchDrafter(DraftConfig(k=3, min_match=5))
    fixed.start(0, text)
    assert fixed.propose([0]).lengths[0] == 0  # the match "1 2 3 4" is 4 < 5
    scaled = BatchDrafter(DraftConfig(k=3, min_match=3, length_policy="scaled"))
    scaled.start(0, text)
    p = scaled.propose([0])
    assert p.match_lengths[0] == 4 and p.lengths[0] == 2  # 4 - 3 + 1
    scaled.start(1, [1, 2, 3, 8, 1, 2, 3])
    assert scaled.propose([1]).lengths[0] == 1  # match 3 -> 1 token


def test_own_context_ignores_group():
    drafter = BatchDrafter(DraftConfig(group_aware=False))
    drafter.start("a", [7], group=1)
    drafter.start("b", [7], group=1)
    drafter.extend(["a"], [1, 2, 3], [3])
    drafter.extend(["b"], [1], [1])
    assert drafter.propose(["b"]).lengths[0] == 0


def test_history_rotates_within_budget():
    drafter = BatchDrafter(DraftConfig(group_aware=False, history_tokens=1000))
    for i in range(30):
        drafter.start(i, [])
        drafter.extend([i], repetitive(100, seed=i, alphabet=1000) + 1000 * i, [100])
        drafter.finish(i)
        assert drafter.history_tokens <= 1000
    drafter.start("new", [])
    drafter.extend(["new"], (repetitive(100, seed=29, alphabet=1000) + 29000)[:10], [10])
    p = drafter.propose(["new"])
    assert p.sources[0] == SOURCE_HISTORY and p.lengths[0] == 3
    drafter.finish("new")
    drafter.start("old", [])
    drafter.extend(["old"], repetitive(100, seed=0, alphabet=1000)[:10], [10])  # evicted long ago
    assert drafter.propose(["old"]).sources[0] in (SOURCE_NONE, SOURCE_GROUP)


def test_drafts_of_a_step_do_not_depend_on_order():
    """Proposing for siblings before extending any of them is what keeps group replay honest."""
    drafter = BatchDrafter(DraftConfig(group_aware=True))
    for i in range(3):
        drafter.start(i, [4, 4], group=0)
    drafter.extend([0, 1, 2], [1, 2, 1, 2, 1, 3], [2, 2, 2])
    forward = drafter.propose([0, 1, 2])
    backward = drafter.propose([2, 1, 0])
    assert np.array_equal(forward.tokens, backward.tokens[::-1])


def test_a_step_drafts_for_the_requests_it_names():
    """`step(..., propose=...)` syncs every row and drafts only for the named ones, in the order named,
    the drafts `sync` then `propose` give; an index outside the batch is refused before anything changes."""
    rows = np.array([[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 9, 8, 9, 8, 9, 8]], dtype=np.int32)
    lengths = [7, 6, 8]
    stepped, synced = BatchDrafter(DraftConfig(k=4)), BatchDrafter(DraftConfig(k=4))
    for drafter in (stepped, synced):
        for i in range(3):
            drafter.start(i, rows[i, :3])
    with pytest.raises(ValueError, match="outside the 3 requests"):
        stepped.step([0, 1, 2], rows, lengths, 4, propose=[0, 3])
    assert [stepped.num_tokens(i) for i in range(3)] == [3, 3, 3]
    proposal = stepped.step([0, 1, 2], rows, lengths, 4, propose=[2, 0])
    synced.sync([0, 1, 2], rows, lengths)
    expected = synced.propose([2, 0], 4)
    assert [stepped.num_tokens(i) for i in range(3)] == lengths
    for got, want in zip(proposal, expected):
        assert np.array_equal(got, want)
    assert proposal.lengths.min() > 0  # both periodic rows draft
    assert stepped.step([0, 1, 2], rows, lengths, 4, propose=[]).tokens.shape == (0, 4)


# ---------------------------------------------------------------- bad input ------------------------
@pytest.mark.parametrize(
    "tokens, message",
    [
        ([1, -2], "negative token id"),
        ([1.5], "integer token ids"),
        (np.ones((2, 2), dtype=np.int32), "1-D"),
        ([2**40], "too large"),
    ],
)
def test_bad_tokens_are_refused_without_damage(tokens, message):
    drafter = BatchDrafter(DraftConfig())
    drafter.start("ok", [1, 2, 3, 1, 2])
    before = drafter.propose(["ok"])
    with pytest.raises(ValueError, match=message):
        drafter.extend(["ok"], tokens, [np.size(tokens)])
    with pytest.raises(ValueError, match=message):
        drafter.start("bad", tokens)
    assert "bad" not in drafter and drafter.num_tokens("ok") == 5
    assert np.array_equal(drafter.propose(["ok"]).tokens, before.tokens)


def test_bad_requests_and_arguments():
    drafter = BatchDrafter(DraftConfig())
    drafter.start("a", [1, 2])
    with pytest.raises(ValueError, match="already started"):
        drafter.start("a", [1])
    with pytest.raises(KeyError, match="unknown request 'zz'"):
        drafter.propose(["a", "zz"])
    with pytest.raises(ValueError, match="k must be"):
        drafter.propose(["a"], -1)
    with pytest.raises(ValueError, match="counts add up"):
        drafter.extend(["a"], [1, 2], [3])
    with pytest.raises(ValueError, match="counts must be"):
        drafter.extend(["a", "a"], [1], [2, -1])
    drafter.finish("a")
    with pytest.raises(KeyError, match="unknown request 'a'"):
        drafter.extend(["a"], [1], [1])  # extending a finished request
    with pytest.raises(KeyError):
        drafter.finish("a")


def test_group_prompt_must_match():
    drafter = BatchDrafter(DraftConfig(group_aware=True))
    drafter.start(1, [5, 6], group="g")
    with pytest.raises(ValueError, match="different prompt"):
        drafter.start(2, [5, 7], group="g")
    assert 2 not in drafter and len(drafter) == 1


def test_sync_refuses_bad_rows_and_appends_nothing():
    drafter = BatchDrafter(DraftConfig())
    drafter.start(0, [1, 2, 3])
    drafter.start(1, [1, 2, 3])
    rows = np.array([[1, 2, 3, 4, 5], [1, 2, 3, -1, 0]], dtype=np.int32)
    with pytest.raises(ValueError, match="request 1"):
        drafter.sync([0, 1], rows, [5, 5])
    assert drafter.num_tokens(0) == 3  # the good row was not half-applied either
    with pytest.raises(ValueError, match="request 0"):
        drafter.sync([0], rows, [2])  # shorter than what was seen
    with pytest.raises(ValueError, match="2-D integer"):
        drafter.sync([0], rows.astype(np.float32), [5])
    drafter.sync([0, 1], rows, [5, 3])
    assert drafter.num_tokens(0) == 5 and drafter.num_tokens(1) == 3


@pytest.mark.parametrize(
    "field, value",
    [
        ("k", -1),
        ("k", 2.0),
        ("min_match", 0),
        ("length_policy", "linear"),
        ("group_aware", 1),
        ("history_tokens", -5),
        ("continuation", "recent"),
        ("min_token_prob", 1.5),
        ("min_token_prob", "high"),
        ("count_prior", -1.0),
        ("recency_weight", 0.5),
        ("recency_weight", 101.0),
        ("recency_weight", "recent"),
        ("long_match", 0),
        ("long_match", 17),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"DraftConfig.{field}"):
        DraftConfig(**{field: value})


def test_confidence_length_needs_counts():
    with pytest.raises(ValueError, match="needs continuation 'frequent'"):
        DraftConfig(continuation="first", length_policy="confidence")
