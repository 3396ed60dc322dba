"""sam_rollout.draft_scoring: full drafts scored against the tokens emitted later, exactly and without bias."""

from __future__ import annotations

import numpy as np
import pytest

from sam_rollout.draft_scoring import ROUND_ROWS, DraftScorer

K = 3


class Recorder:
    """Stands in for the switch: keeps what each round reported."""

    def __init__(self):
        self.rounds = []

    def observe_acceptance(self, rows, drafted_at, accepted_at):
        self.rounds.append((rows, drafted_at.copy(), accepted_at.copy()))


def test_a_draft_is_decided_by_its_first_mismatch_or_by_its_last_token():
    scorer = DraftScorer(K, K + 1)
    tokens = np.zeros((3, 16), dtype=np.int64)
    tokens[:, :4] = [1, 2, 3, 4]
    lengths = np.array([4, 4, 4])
    scorer.add("miss2", 4, np.array([5, 6, 7]))
    scorer.add("full", 4, np.array([5, 6, 7]))
    scorer.add("none", 4, np.array([], dtype=np.int64))  # no draft: a row, nothing drafted
    ids = ["miss2", "full", "none"]
    tokens[:, 4] = 5
    lengths[:] = 5
    scorer.resolve(ids, tokens, lengths)
    assert scorer.rows == 1  # only the empty draft is decided so far
    tokens[:, 5] = [9, 6, 0]
    lengths[:] = 6
    scorer.resolve(ids, tokens, lengths)
    assert scorer.rows == 2  # miss2: tokens 5, 9 against 5, 6
    tokens[1, 6:8] = [7, 8]  # full: the whole draft and the next token
    lengths[1] = 8
    scorer.resolve(ids, tokens, lengths)
    switch = Recorder()
    scorer.start_round(switch)
    rows, drafted_at, accepted_at = switch.rounds[0]
    assert rows == 3
    assert drafted_at.tolist() == [0, 2, 2, 2]
    assert accepted_at.tolist() == [0, 2, 1, 1]


def test_an_undecided_draft_counts_in_the_round_that_decides_it():
    scorer = DraftScorer(K, K + 1)
    scorer.add("slow", 4, np.array([5, 6, 7]))
    scorer.add("gone", 4, np.array([5, 6, 7]))
    scorer.drop("gone")  # finished before its draft was decided: never counted
    tokens = np.array([[1, 2, 3, 4, 5, 6, 0, 0]])
    scorer.resolve(["slow"], tokens, np.array([6]))  # two of three tokens match: undecided
    switch = Recorder()
    scorer.start_round(switch)
    assert switch.rounds[0][0] == 0
    tokens[0, 6] = 7
    scorer.resolve(["slow"], tokens, np.array([7]))
    scorer.start_round(switch)
    rows, drafted_at, accepted_at = switch.rounds[1]
    assert rows == 1 and drafted_at.tolist() == [0, 1, 1, 1] and accepted_at.tolist() == [0, 1, 1, 1]


def test_a_pause_drops_undecided_drafts():
    scorer = DraftScorer(K, K + 1)
    scorer.add("slow", 4, np.array([5, 6, 7]))
    scorer.discard_round()
    scorer.resolve(["slow"], np.array([[1, 2, 3, 4, 5, 6, 7, 8]]), np.array([8]))
    switch = Recorder()
    scorer.start_round(switch)
    assert switch.rounds[0][0] == 0


def test_between_round_starts_rows_are_scored_until_the_round_holds_round_rows():
    scorer = DraftScorer(K, K + 1)
    scorer.round_due()
    assert scorer.rows_to_score(range(20), round_start=True) == list(range(20))  # a round start: every row
    scorer.add("r0", 4, np.array([5, 6, 7]))
    for _ in range(ROUND_ROWS - 4):
        scorer.add("other", 4, np.array([], dtype=np.int64))
    scorer.round_due()
    between = scorer.rows_to_score(range(6), round_start=False)
    assert len(between) == 3  # 3 more rows fill the round
    scorer.round_due()
    assert scorer.rows_to_score(range(6), round_start=False) != between  # another first row
    for r in ("r1", "r2", "r3"):
        scorer.add(r, 4, np.array([], dtype=np.int64))
    assert scorer.rows_to_score(range(6), round_start=False) == []  # the round is full


def test_drafts_of_several_steps_of_one_row_are_each_decided():
    scorer = DraftScorer(K, K + 1)
    scorer.add("r", 4, np.array([5, 6, 7]))  # step 1: right in full
    scorer.add("r", 5, np.array([6, 7, 9]))  # step 2: right at its first two positions
    tokens = np.array([[1, 2, 3, 4, 5, 6, 7, 8]])
    scorer.resolve(["r"], tokens, np.array([6]))
    assert scorer.rows == 0  # both match so far
    scorer.resolve(["r"], tokens, np.array([7]))
    assert scorer.rows == 1  # the first is decided, the second still matches
    scorer.resolve(["r"], tokens, np.array([8]))
    switch = Recorder()
    scorer.start_round(switch)
    rows, drafted_at, accepted_at = switch.rounds[0]
    assert rows == 2 and drafted_at.tolist() == [0, 2, 2, 2] and accepted_at.tolist() == [0, 2, 2, 1]


def test_rounds_are_due_every_n_steps():
    scorer = DraftScorer(K, 5)
    assert [scorer.round_due() for _ in range(11)] == [True, False, False, False, False] * 2 + [True]
    with pytest.raises(ValueError, match=">= 1 step"):
        DraftScorer(K, 0)


@pytest.mark.parametrize("n_rows,steps", [(32, 400), (2, 3000)])
def test_scored_acceptance_is_unbiased_for_sampled_tokens(n_rows, steps):
    """A Markov chain sampled one token per step (as at k = 0); point-mass drafts of its likeliest path,
    taken as the stepper takes them (every row at a round start, and between round starts more rows up
    to ROUND_ROWS a round: with 2 rows, a draft of every row in every step). The scored counts per
    position match the exact expectation, the sum over drafts of the product of the chain's probabilities
    of the draft tokens, which is what verification would accept."""
    rng = np.random.default_rng(0)
    vocab = 6
    chain = rng.dirichlet(np.full(vocab, 0.4), size=vocab)  # peaked rows: drafts often right
    likeliest = chain.argmax(axis=1)
    tokens = np.zeros((n_rows, steps + 2), dtype=np.int64)
    lengths = np.ones(n_rows, dtype=np.int64)
    ids = list(range(n_rows))
    scorer = DraftScorer(K, K + 1)
    switch = Recorder()
    expected = np.zeros(K + 1)
    added = 0

    def earned(prev, draft):  # the chance that each prefix of the draft is what the chain emits
        return np.cumprod([chain[a, b] for a, b in zip([prev, *draft[:-1]], draft)])

    for _ in range(steps):
        scorer.resolve(ids, tokens, lengths)
        round_start = scorer.round_due()
        if round_start:
            scorer.start_round(switch)
        for r in scorer.rows_to_score(ids, round_start):
            draft, prev = [], tokens[r, lengths[r] - 1]
            for _ in range(K):
                prev = likeliest[prev]
                draft.append(prev)
            scorer.add(r, int(lengths[r]), np.array(draft))
            added += 1
            expected[1:] += earned(tokens[r, lengths[r] - 1], draft)
        for r in ids:  # the engine emits one sampled token per row
            tokens[r, lengths[r]] = rng.choice(vocab, p=chain[tokens[r, lengths[r] - 1]])
            lengths[r] += 1
    scorer.resolve(ids, tokens, lengths)
    scorer.start_round(switch)
    undecided = 0
    for r, drafts in scorer._pending.items():  # the last drafts, not scored
        for start, draft in drafts:
            expected[1:] -= earned(tokens[r, start - 1], draft)
            undecided += 1
    accepted = sum(r[2] for r in switch.rounds)
    drafted = sum(r[1] for r in switch.rounds)
    rows = sum(r[0] for r in switch.rounds)
    assert rows == added - undecided and drafted[1:].tolist() == [rows] * K
    if n_rows == 2:  # between round starts too: a draft per row and step
        assert added == n_rows * steps
    for j in range(1, K + 1):
        sd = np.sqrt(expected[j])  # Poisson-binomial: variance below the mean
        assert abs(accepted[j] - expected[j]) < 4 * sd, (j, accepted[j], expected[j])
    assert accepted[1] > accepted[2] > accepted[3] > 0
