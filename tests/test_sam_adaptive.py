"""The adaptive continuation: each draft is the first occurrence's or the frequent one's, as the group's
record of which was right where they differed says (replayed here in plain Python)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sam_rollout.drafter import BatchDrafter, DraftConfig, draft, layout

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


class ReferenceWins:
    """score_guesses and the choice in _adaptive, in plain Python."""

    def __init__(self) -> None:
        self.first = self.frequent = 0

    def prefers_first(self, first_draft) -> bool:
        return len(first_draft) > 0 and 100 * self.first > draft.FIRST_LEAD_PERCENT * self.frequent

    def score(self, first_draft, frequent_draft, token: int) -> None:
        g1 = int(first_draft[0]) if len(first_draft) else -1
        g2 = int(frequent_draft[0]) if len(frequent_draft) else -1
        if g1 == g2:
            return
        self.first -= self.first >> layout.WIN_SHIFT
        self.frequent -= self.frequent >> layout.WIN_SHIFT
        if token == g1:
            self.first += layout.WIN_UNIT
        elif token == g2:
            self.frequent += layout.WIN_UNIT


def drafts(drafter, req_ids, k):
    p = drafter.propose(req_ids, k)
    return [p.tokens[i, : p.lengths[i]].tolist() for i in range(len(req_ids))]


def lockstep(prompt, texts, policy, k, earlier=()):
    """Siblings of one group advance one token a step; at every step the adaptive drafter's drafts are
    checked against first/frequent drafters fed the same tokens. `earlier`: responses of an earlier
    visit of the prompt, kept by the prompt store. Returns how often each was sent where the two
    differed."""
    store = dict(prompt_store=True) if earlier else {}
    made = {c: BatchDrafter(DraftConfig(continuation=c, **policy, **store)) for c in ("first", "frequent", "adaptive")}
    ids = list(range(len(texts)))
    for d in made.values():
        for i, response in enumerate(earlier):
            d.start(("earlier", i), prompt, group="earlier")
            d.extend([("earlier", i)], response, [len(response)])
        for i in range(len(earlier)):
            d.finish(("earlier", i))
        for r in ids:
            d.start(r, prompt, group="g")
    wins = ReferenceWins()
    sent = {"first": 0, "frequent": 0}
    for pos in range(max(len(t) for t in texts)):
        live = [r for r in ids if pos < len(texts[r])]
        got = {c: drafts(d, live, k) for c, d in made.items()}
        for row, r in enumerate(live):
            first, frequent, adaptive = got["first"][row], got["frequent"][row], got["adaptive"][row]
            want = first if wins.prefers_first(first) else frequent
            assert adaptive == want, (pos, r, first, frequent, adaptive, wins.first, wins.frequent)
            if first != frequent:
                sent["first" if want is first else "frequent"] += 1
        for row, r in enumerate(live):  # siblings' tokens of this step land after every draft
            wins.score(got["first"][row], got["frequent"][row], texts[r][pos])
        for d in made.values():
            d.extend(live, [texts[r][pos] for r in live], [1] * len(live))
    return sent


def test_follows_the_first_occurrence_on_copied_text_and_the_counts_on_noise():
    """Siblings that copy a text in their prompt with a few changes (answers that restate the problem)
    make the first occurrence win; i.i.d. skewed noise (T=1.0 chatter) makes the counts win. Both
    happen, and every draft is the one the reference chooses."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 40, 300)
    copied = []
    for _ in range(3):
        t = base.copy()
        where = rng.random(t.size) < 0.08
        t[where] = rng.integers(0, 40, int(where.sum()))
        copied.append(t.tolist())
    noise = [rng.choice(6, 300, p=[0.4, 0.25, 0.15, 0.1, 0.05, 0.05]).tolist() for _ in range(3)]
    policy = dict(long_match=16, count_prior=4.0, recency_weight=1.5)
    sent_copied = lockstep(base.tolist(), copied, policy, k=3)
    sent_noise = lockstep([1, 2, 3], noise, policy, k=3)
    assert sent_copied["first"] > sent_copied["frequent"], sent_copied
    assert sent_noise["frequent"] > sent_noise["first"], sent_noise


@PROPERTY
@given(
    data=st.data(),
    policy=st.fixed_dictionaries(
        {
            "min_match": st.integers(1, 3),
            "length_policy": st.sampled_from(["fixed", "scaled", "match"]),
            "match_scale": st.sampled_from([0.25, 1.0]),
            "count_prior": st.sampled_from([0.0, 1.0, 4.0]),
            "long_match": st.sampled_from([1, 4, 8]),
            "recency_weight": st.sampled_from([1.0, 1.5]),
        }
    ),
    k=st.sampled_from([1, 2, 3, 4, 5, 16]),
)
def test_every_draft_is_the_one_the_reference_chooses(data, policy, k):
    alphabet = st.integers(0, data.draw(st.integers(1, 5)))
    prompt = data.draw(st.lists(alphabet, max_size=8))
    texts = data.draw(st.lists(st.lists(alphabet, min_size=1, max_size=60), min_size=1, max_size=3))
    earlier = data.draw(st.lists(st.lists(alphabet, min_size=1, max_size=40), max_size=2))
    lockstep(prompt, texts, policy, k, earlier)


def test_confidence_length_needs_the_frequent_continuation():
    with pytest.raises(ValueError, match="confidence"):
        DraftConfig(continuation="adaptive", length_policy="confidence")
