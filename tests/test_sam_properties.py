"""The compiled drafter against definitions: brute force on small alphabets, the reference on long runs."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sam_helpers import appended_one_by_one, finish_into_history

from sam_rollout.drafter import BatchDrafter, DraftConfig, SuffixAutomaton
from testkit.reference_drafter import ReferenceAutomaton, brute_force_draft, brute_force_history_draft

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def alphabet_and(seq_strategy):
    return st.integers(2, 5).flatmap(lambda a: seq_strategy(st.integers(0, a - 1)))


@PROPERTY
@given(tokens=alphabet_and(lambda sym: st.lists(sym, min_size=1, max_size=300)), k=st.integers(1, 5))
def test_single_stream_matches_brute_force_after_every_append(tokens, k):
    sa = SuffixAutomaton()
    ref = ReferenceAutomaton()
    member = ref.add_member()
    for token in tokens:
        sa.extend([token])
        ref.append(member, token)
        expected, match = brute_force_draft(ref, member, k)
        assert sa.draft(k).tolist() == expected
        assert sa.match_length == match


@PROPERTY
@given(prompt=alphabet_and(lambda sym: st.lists(sym, max_size=12)), data=st.data())
def test_group_siblings_match_brute_force(prompt, data):
    """Siblings appending in any interleaving draft exactly what the definition says."""
    alphabet = max(prompt, default=1) + 1
    siblings = data.draw(st.integers(1, 4))
    appends = data.draw(st.lists(st.tuples(st.integers(0, siblings - 1), st.integers(0, alphabet - 1)), max_size=120))
    drafter = BatchDrafter(DraftConfig(k=4, length_policy="fixed", group_aware=True, continuation="first"))
    ref = ReferenceAutomaton()
    shared = ref.add_member()
    for token in prompt:
        ref.append(shared, token)
    members = [ref.add_member(shared) for _ in range(siblings)]
    for i in range(siblings):
        drafter.start(i, prompt, group="g")
    ids = list(range(siblings))
    for i, token in appends:
        drafter.extend([i], [token], [1])
        ref.append(members[i], token)
        proposal = drafter.propose(ids, 4)
        for j in ids:
            got = proposal.tokens[j, : proposal.lengths[j]].tolist(), int(proposal.match_lengths[j])
            assert got == brute_force_draft(ref, members[j], 4)


@PROPERTY
@given(data=st.data())
def test_history_source_matches_brute_force(data):
    """With a fixed history, the draft is the longer of the own-context and history matches."""
    alphabet = data.draw(st.integers(2, 4))
    sym = st.integers(0, alphabet - 1)
    history = data.draw(st.lists(st.lists(sym, min_size=1, max_size=40), min_size=1, max_size=4))
    prompt = data.draw(st.lists(sym, max_size=6))
    steps = data.draw(st.lists(sym, min_size=1, max_size=60))
    drafter = BatchDrafter(
        DraftConfig(k=4, length_policy="fixed", group_aware=False, history_tokens=1 << 20, continuation="first")
    )
    finish_into_history(drafter, history)
    for own, member, text in appended_one_by_one(drafter, "r", prompt, steps):
        from_own = own.draft(member, 4)
        from_history = brute_force_history_draft(history, text, 4)
        expected = from_history if from_history[1] > from_own[1] else from_own
        proposal = drafter.propose(["r"], 4)
        assert (proposal.tokens[0, : proposal.lengths[0]].tolist(), int(proposal.match_lengths[0])) == expected


def test_reference_matches_brute_force_with_shared_prompt():
    """The reference itself, on generalised texts with interleaved members."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        ref = ReferenceAutomaton()
        shared = ref.add_member()
        for token in rng.integers(0, 3, size=rng.integers(0, 8)):
            ref.append(shared, int(token))
        members = [ref.add_member(shared) for _ in range(3)]
        for _ in range(50):
            ref.append(members[rng.integers(3)], int(rng.integers(0, 3)))
            for m in members:
                assert ref.draft(m, 3) == brute_force_draft(ref, m, 3)


def test_compiled_matches_reference_on_long_streams():
    """20k tokens over a tiny and a large alphabet: every 97th draft compared with the reference."""
    rng = np.random.default_rng(1)
    for alphabet in (3, 1000):
        # Repetitive text: copies of earlier spans with mutations, like model output.
        tokens = list(rng.integers(0, alphabet, size=200))
        while len(tokens) < 20000:
            start = int(rng.integers(0, len(tokens) - 50))
            span = tokens[start : start + int(rng.integers(5, 50))]
            tokens += span + [int(rng.integers(0, alphabet))]
        sa = SuffixAutomaton()
        ref = ReferenceAutomaton()
        member = ref.add_member()
        for i, token in enumerate(tokens[:20000]):
            sa.extend([token])
            ref.append(member, token)
            if i % 97 == 0:
                assert sa.draft(3).tolist() == ref.draft(member, 3)[0]
                assert sa.match_length == ref.draft(member, 3)[1]


def test_batch_extend_equals_one_at_a_time():
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 6, size=500)
    one = SuffixAutomaton()
    for t in tokens:
        one.extend([t])
    batch = SuffixAutomaton(tokens[:100])
    batch.extend(tokens[100:])
    assert one.draft(3).tolist() == batch.draft(3).tolist()
    assert one.match_length == batch.match_length
    assert len(one) == len(batch) == 500


def test_sync_from_rows_equals_extend():
    """sync() reads each row past what it has seen, as an engine's token table would be read."""
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 5, size=(4, 300)).astype(np.int32)
    by_sync, by_extend = BatchDrafter(DraftConfig(group_aware=False)), BatchDrafter(DraftConfig(group_aware=False))
    for i in range(4):
        by_sync.start(i, rows[i, :20])
        by_extend.start(i, rows[i, :20])
    lengths = np.full(4, 20)
    for _ in range(60):
        grow = rng.integers(1, 5, size=4)
        by_extend.extend(range(4), np.concatenate([rows[i, lengths[i] : lengths[i] + grow[i]] for i in range(4)]), grow)
        lengths += grow
        by_sync.sync(range(4), rows, lengths)
        a, b = by_sync.propose(range(4)), by_extend.propose(range(4))
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.match_lengths, b.match_lengths)


def test_step_equals_sync_then_propose():
    rng = np.random.default_rng(4)
    rows = rng.integers(0, 4, size=(3, 400)).astype(np.int32)
    rows[:, :10] = rows[0, :10]  # siblings share the prompt
    fused, apart = BatchDrafter(DraftConfig()), BatchDrafter(DraftConfig())
    for i in range(3):
        fused.start(i, rows[i, :10], group=i % 2)
        apart.start(i, rows[i, :10], group=i % 2)
    lengths = np.full(3, 10)
    for _ in range(80):
        lengths += rng.integers(1, 5, size=3)
        a = fused.step(range(3), rows, lengths, 3)
        apart.sync(range(3), rows, lengths)
        b = apart.propose(range(3), 3)
        for x, y in zip(a, b):
            assert np.array_equal(x, y)
