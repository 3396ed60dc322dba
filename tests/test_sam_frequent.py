"""The frequent continuation (occurrence counts, scored drafts) against its brute-force definition."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sam_helpers import appended_one_by_one, finish_into_history, single_member

from sam_rollout.drafter import SOURCE_GROUP, SOURCE_HISTORY, SOURCE_NONE, BatchDrafter, DraftConfig, layout
from sam_rollout.drafter import edges as edge_blocks
from testkit.reference_drafter import MatchLength, ReferenceAutomaton, brute_force_frequent_draft, kept_follower

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
SOURCE_OF = {None: SOURCE_NONE, 0: SOURCE_GROUP}

policies = st.fixed_dictionaries(
    {
        "k": st.sampled_from([1, 2, 3, 4, 5, 6, 8, 16]),  # beyond 5, paths can leave the scored states
        "min_match": st.integers(1, 3),
        "length_policy": st.sampled_from(["fixed", "scaled", "confidence", "match"]),
        "base_k": st.integers(1, 4),
        "match_scale": st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5]),
        "min_token_prob": st.sampled_from([0.0, 0.2, 0.5]),
        "count_prior": st.sampled_from([0.0, 1.0, 2.5]),
        "long_match": st.sampled_from([1, 4, 8, 16]),
        "recency_weight": st.sampled_from([1.0, 1.5, 2.0, 100.0]),
    }
)


def frequent(policy, **kw) -> DraftConfig:
    return DraftConfig(continuation="frequent", **policy, **kw)


def expected(sources, text, config):
    by_match = MatchLength(config.base_k, config.match_scale) if config.length_policy == "match" else None
    min_prob = config.min_token_prob if config.length_policy in ("confidence", "match") else 0.0
    tokens, match, source = brute_force_frequent_draft(
        sources,
        text,
        config.k,
        config.min_match,
        config.length_policy == "scaled",
        min_prob,
        config.count_prior,
        config.long_match,
        recency_weight=config.recency_weight,
        by_match=by_match,
    )
    return tokens, match, SOURCE_OF.get(source, SOURCE_HISTORY)


def proposed(drafter, req_id):
    p = drafter.propose([req_id])
    return p.tokens[0, : p.lengths[0]].tolist(), int(p.match_lengths[0]), int(p.sources[0])


def alphabet_and(seq_strategy):
    return st.integers(2, 5).flatmap(lambda a: seq_strategy(st.integers(0, a - 1)))


@PROPERTY
@given(tokens=alphabet_and(lambda sym: st.lists(sym, min_size=1, max_size=70)), policy=policies)
def test_single_stream_matches_definition_after_every_append(tokens, policy):
    config = frequent(policy, group_aware=False)
    drafter = BatchDrafter(config)
    drafter.start(0, [])
    ref = ReferenceAutomaton()
    member = ref.add_member()
    for i, token in enumerate(tokens):
        drafter.extend([0], [token], [1])
        ref.append(member, token)
        assert proposed(drafter, 0) == expected([ref], tokens[: i + 1], config)


@PROPERTY
@given(prompt=alphabet_and(lambda sym: st.lists(sym, max_size=10)), policy=policies, data=st.data())
def test_group_siblings_match_definition(prompt, policy, data):
    """Siblings share the prompt's last position; counts see each one's continuation of it."""
    alphabet = max(prompt, default=1) + 1
    siblings = data.draw(st.integers(1, 3))
    appends = data.draw(st.lists(st.tuples(st.integers(0, siblings - 1), st.integers(0, alphabet - 1)), max_size=60))
    config = frequent(policy, group_aware=True)
    drafter = BatchDrafter(config)
    ref = ReferenceAutomaton()
    shared = ref.add_member()
    for token in prompt:
        ref.append(shared, token)
    members = [ref.add_member(shared) for _ in range(siblings)]
    texts = [list(prompt) for _ in range(siblings)]
    for i in range(siblings):
        drafter.start(i, prompt, group="g")
    for i, token in appends:
        drafter.extend([i], [token], [1])
        ref.append(members[i], token)
        texts[i].append(token)
        for j in range(siblings):
            assert proposed(drafter, j) == expected([ref], texts[j], config)


@PROPERTY
@given(policy=policies, data=st.data())
def test_history_pooled_with_own_text_matches_definition(policy, data):
    alphabet = data.draw(st.integers(2, 4))
    sym = st.integers(0, alphabet - 1)
    history = data.draw(st.lists(st.lists(sym, min_size=1, max_size=30), min_size=1, max_size=4))
    prompt = data.draw(st.lists(sym, max_size=5))
    steps = data.draw(st.lists(sym, min_size=1, max_size=40))
    config = frequent(policy, group_aware=False, history_tokens=1 << 20)
    drafter = BatchDrafter(config)
    hist = finish_into_history(drafter, history)
    for own, _, text in appended_one_by_one(drafter, "r", prompt, steps):
        assert proposed(drafter, "r") == expected([own, hist], text, config)


def test_long_stream_with_many_followers_matches_definition():
    """Large alphabets give states with more than 8 continuations (hash blocks), where keeping the
    most frequent one inline deletes from and inserts into the hash table."""
    rng = np.random.default_rng(5)
    config = DraftConfig(continuation="frequent", group_aware=False, k=3, count_prior=1.0)
    for alphabet, hub in ((40, 0), (12, 3)):
        drafter = BatchDrafter(config)
        drafter.start(0, [])
        ref = ReferenceAutomaton()
        member = ref.add_member()
        text = []
        for i in range(1200):
            token = hub if i % 2 == 0 else int(rng.zipf(1.5) % alphabet)  # the hub has many followers
            drafter.extend([0], [token], [1])
            ref.append(member, token)
            text.append(token)
            if i % 150 == 149:
                assert proposed(drafter, 0) == expected([ref], text, config)
        assert kept_follower(ref, [hub], config.recency_weight) == proposed_after(drafter, hub)


def prefix_repeats(rng, n):
    """Binary text made of prefixes of one random string, each followed by a short run of one bit:
    long paths whose shorter suffixes occur elsewhere too."""
    base = [int(t) for t in rng.integers(0, 2, size=30)]
    text = []
    while len(text) < n:
        text += base[: int(rng.integers(15, 30))] + [int(rng.integers(0, 2))] * int(rng.integers(1, 3))
    return text[:n]


def test_drafts_stop_where_counts_are_not_kept():
    """A draft of 8 tokens from a match of up to 16 can reach strings whose shortest form is longer
    than score_depth(16) = 20; there the source drops out. Texts where that changes the draft are covered."""
    rng = np.random.default_rng(1)
    config = DraftConfig(continuation="frequent", group_aware=False, k=8, count_prior=0.0, long_match=16)
    changed = 0
    for _ in range(34):
        text = prefix_repeats(rng, 300)
        for cut in (180, 280):
            drafter = BatchDrafter(config)
            drafter.start(0, text[:cut])
            ref, _ = single_member(text[:cut])
            want = expected([ref], text[:cut], config)
            assert proposed(drafter, 0) == want
            deeper = brute_force_frequent_draft([ref], text[:cut], 8, prior=0.0, long_match=16, score_depth=1000)
            changed += deeper[:2] != want[:2]
    assert changed > 0


def proposed_after(drafter, token):
    """The first drafted token right after appending `token` once more (a 1-token context)."""
    drafter.extend([0], [token], [1])
    p = drafter.propose([0], 1)
    return int(p.tokens[0, 0])


def test_promote_keeps_every_edge():
    """Moving an edge inline and the inline one into a linear or hash block loses nothing."""
    for degree in (3, 9, 40):
        states, edges, _, meta = layout.new_automaton_arrays(3000)  # room for every block this grows through
        states[layout.STATE_WIDTH : 2 * layout.STATE_WIDTH] = (1, 0, 0, layout.NO_EDGE, -1, layout.NO_BLOCK, 0)
        meta[layout.M_STATES] = 2
        targets = {}
        for t in range(degree):
            edge_blocks.set_edge(states, edges, meta, 1, 7 * t + 1, 100 + t)
            targets[7 * t + 1] = 100 + t
        rng = np.random.default_rng(degree)
        for token in rng.choice(list(targets), size=50):
            if states[layout.STATE_WIDTH + layout.S_TOKEN] != token:
                edge_blocks._promote(states, edges, 1, int(token))
            assert states[layout.STATE_WIDTH + layout.S_TOKEN] == token
            for t, target in targets.items():
                assert edge_blocks.get_edge(states, edges, 1, t) == target
            assert edge_blocks.get_edge(states, edges, 1, 2) == -1


def test_counts_drafts_from_the_most_frequent_continuation():
    """'1 2' is followed by 3 once, then by 4 twice: first occurrence drafts 3, frequent drafts 4."""
    text = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 4, 7, 1, 2]
    first = BatchDrafter(DraftConfig(k=1, group_aware=False, continuation="first"))
    freq = BatchDrafter(DraftConfig(k=1, group_aware=False, continuation="frequent"))
    for d in (first, freq):
        d.start(0, text)
    assert proposed(first, 0)[0] == [3]
    assert proposed(freq, 0)[0] == [4]


def test_recency_weight_lets_a_recent_continuation_take_over():
    """'1 2' is followed by 3 twice, then by 4 once, then by 4 again: with weight 1 the draft turns
    to 4 only at the tie; with weight 2 already after 4's first occurrence."""
    head = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7]
    for weight, after_one, after_two in ((1.0, 3, 4), (2.0, 4, 4), (1.5, 3, 4)):
        drafter = BatchDrafter(DraftConfig(k=1, group_aware=False, continuation="frequent", recency_weight=weight))
        drafter.start(0, head + [1, 2])
        assert proposed(drafter, 0)[0] == [after_one]
        drafter.extend([0], [4, 6, 1, 2], [4])
        assert proposed(drafter, 0)[0] == [after_two]


def test_confidence_stops_below_the_threshold():
    """After '5' (seen 3 times before, followed by 6 twice), the estimate is 2 / (3 + prior): the text's own
    '5' at its end, a fourth occurrence, has no continuation yet."""
    text = [5, 6, 1, 5, 6, 2, 5, 3, 5]
    for prior, threshold, drafted in ((0.0, 0.66, 1), (0.0, 0.67, 0), (1.0, 0.5, 1), (1.0, 0.55, 0)):
        d = BatchDrafter(
            DraftConfig(
                k=1,
                group_aware=False,
                continuation="frequent",
                length_policy="confidence",
                count_prior=prior,
                min_token_prob=threshold,
            )
        )
        d.start(0, text)
        assert d.propose([0]).lengths[0] == drafted
