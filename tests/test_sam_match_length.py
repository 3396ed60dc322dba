"""Match-scaled draft length (length_policy "match") against its brute-force definition, and the old
behaviour it keeps at k <= base_k."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sam_helpers import single_member
from test_prompt_store import SOURCE_OF, prompt_with_responses, visit

from sam_rollout.drafter import BatchDrafter, DraftConfig
from testkit.reference_drafter import (
    MatchLength,
    brute_force_draft,
    brute_force_first_draft,
    brute_force_frequent_draft,
    draft_length,
)

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def proposed(drafter, req_ids, k=None):
    p = drafter.propose(req_ids, k)
    return [
        (p.tokens[i, : p.lengths[i]].tolist(), int(p.match_lengths[i]), int(p.sources[i])) for i in range(len(req_ids))
    ]


def repetitive(data, max_size=120):
    """Text over a small alphabet with copied stretches: long matches, so long drafts."""
    sym = st.integers(0, data.draw(st.integers(2, 4)) - 1)
    pieces = data.draw(st.lists(st.lists(sym, min_size=1, max_size=30), min_size=1, max_size=4))
    text = []
    for _ in range(data.draw(st.integers(1, 6))):
        text += pieces[data.draw(st.integers(0, len(pieces) - 1))]
    return text[:max_size]


match_policies = st.fixed_dictionaries(
    {
        "k": st.sampled_from([1, 3, 5, 8, 16]),
        "base_k": st.integers(1, 4),
        "match_scale": st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]),
        "min_match": st.integers(1, 3),
        "min_token_prob": st.sampled_from([0.0, 0.1, 0.3]),
        "count_prior": st.sampled_from([0.0, 4.0]),
        "long_match": st.sampled_from([2, 8, 16]),
    }
)


@PROPERTY
@given(data=st.data(), policy=match_policies)
def test_first_occurrence_single_stream_is_its_definition(data, policy):
    text = repetitive(data)
    config = DraftConfig(continuation="first", length_policy="match", group_aware=False, **policy)
    by_match = MatchLength(config.base_k, config.match_scale)
    drafter = BatchDrafter(config)
    drafter.start(0, [])
    ref, member = single_member([])
    for token in text:
        drafter.extend([0], [token], [1])
        ref.append(member, token)
        cont, match = brute_force_draft(ref, member, config.k)
        count = min(draft_length(match, config.k, config.min_match, False, by_match), len(cont))
        want = (cont[:count], match) if count > 0 else ([], match if cont else 0)
        got = proposed(drafter, [0])[0]
        assert got[0] == want[0] and (not want[0] or got[1] == want[1])


@PROPERTY
@given(data=st.data(), policy=match_policies, continuation=st.sampled_from(["first", "frequent"]))
def test_revisit_with_store_and_siblings_is_its_definition(data, policy, continuation):
    """A revisit drafts from its siblings (the group) and the stored earlier visit, the sources whose
    long matches the new length is for."""
    prompt = repetitive(data, 8)
    earlier = [repetitive(data, 60) for _ in range(data.draw(st.integers(1, 2)))]
    steps = repetitive(data, 60)
    config = DraftConfig(continuation=continuation, length_policy="match", prompt_store=True, **policy)
    by_match = MatchLength(config.base_k, config.match_scale)
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
            cont, match, source = brute_force_first_draft([group, stored], text, config.k)
            count = min(draft_length(match, config.k, config.min_match, False, by_match), len(cont))
            want = (cont[:count], match, source if count > 0 else None)
        else:
            want = brute_force_frequent_draft(
                [group, stored],
                text,
                config.k,
                config.min_match,
                min_prob=config.min_token_prob,
                prior=config.count_prior,
                long_match=config.long_match,
                recency_weight=config.recency_weight,
                by_match=by_match,
            )
        got = proposed(drafter, ["r"])[0]
        assert got[0] == want[0]
        if want[0]:
            assert got[1:] == (want[1], SOURCE_OF[want[2]])


@PROPERTY
@given(
    data=st.data(),
    continuation=st.sampled_from(["first", "frequent", "adaptive"]),
    k=st.integers(1, 3),
    history=st.booleans(),
)
def test_match_at_k_up_to_base_k_is_fixed_bit_for_bit(data, continuation, k, history):
    """k <= base_k (3 by default): every proposal equals the fixed length's, whatever the source."""
    prompt = repetitive(data, 10)
    responses = [repetitive(data, 80) for _ in range(3)]
    common = dict(continuation=continuation, k=k, history_tokens=(1 << 16) if history else 0, prompt_store=True)
    made = [BatchDrafter(DraftConfig(length_policy=policy, **common)) for policy in ("fixed", "match")]
    for d in made:
        visit(d, prompt, responses[:1], "earlier")
        for i in range(1, 3):
            d.start(i, prompt, group="g")
    for pos in range(max(len(r) for r in responses[1:])):
        live = [i for i in (1, 2) if pos < len(responses[i])]
        got = [proposed(d, live) for d in made]
        assert got[0] == got[1]
        for d in made:
            d.extend(live, [responses[i][pos] for i in live], [1] * len(live))


def test_long_matches_draft_long_and_short_ones_base_k():
    """A text repeated after itself: a match of m tokens drafts max(base_k, m * scale) up to k."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 1000, 200).tolist()
    config = DraftConfig(continuation="first", length_policy="match", k=16, base_k=3, match_scale=0.25)
    drafter = BatchDrafter(config)
    drafter.start(0, base + base[:20])  # match of 20 tokens
    assert drafter.propose([0]).lengths[0] == 5
    drafter.extend([0], base[20:100], [80])  # match of 100 tokens
    assert drafter.propose([0]).lengths[0] == 16
    assert drafter.propose([0], 4).lengths[0] == 4  # an engine's per-step k caps it
    short = BatchDrafter(config)
    short.start(0, base[:50] + [5000] + base[:2])  # match of 2 tokens
    assert short.propose([0]).lengths[0] == 3


def test_confidence_gates_only_the_tokens_beyond_base_k():
    """After '5' (followed by 6 twice in 3 occurrences), a counted draft of 2 tokens at threshold 0.9:
    base_k 1 keeps only the first token; base_k 2 drafts both whatever their probability."""
    text = [5, 6, 1, 5, 6, 2, 5, 3, 5]
    common = dict(k=2, match_scale=4.0, group_aware=False, continuation="frequent", length_policy="match")
    for base_k, drafted in ((1, 1), (2, 2)):
        d = BatchDrafter(DraftConfig(base_k=base_k, min_token_prob=0.9, count_prior=0.0, **common))
        d.start(0, text)
        assert d.propose([0]).lengths[0] == drafted


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("base_k", 0, "base_k must be >= 1"),
        ("base_k", 2.5, "base_k must be an integer"),
        ("match_scale", -0.5, "match_scale must be in"),
        ("match_scale", 100.0, "match_scale must be in"),
        ("match_scale", "long", "match_scale must be a number"),
    ],
)
def test_bad_settings_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        DraftConfig(**{field: value})


def test_reference_draft_length():
    by = MatchLength(base_k=3, match_scale=0.5)
    assert [draft_length(m, 16, 1, False, by) for m in (0, 1, 6, 7, 8, 20, 40)] == [0, 3, 3, 3, 4, 10, 16]
    assert draft_length(2, 16, 3, False, by) == 0  # below min_match
