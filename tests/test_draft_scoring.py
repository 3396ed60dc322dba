"""rollout.draft_scoring: full drafts scored against the tokens emitted later, exactly and without bias."""

from __future__ import annotations

import numpy as np
import pytest

from rollout.draft_scoring import DraftScorer

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


def test_a_round_drops_undecided_and_finished_drafts():
    scorer = DraftScorer(K, K + 1)
    scorer.add("slow", 4, np.array([5, 6, 7]))
    scorer.add("gone", 4, np.array([5, 6, 7]))
    scorer.drop("gone")
    tokens = np.array([[1, 2, 3, 4, 5, 6, 0, 0]])
    scorer.resolve(["slow"], tokens, np.array([6]))  # two of three tokens match: undecided
    switch = Recorder()
    scorer.start_round(switch)
    assert switch.rounds[0][0] == 0
    tokens[0, 6] = 7
    scorer.resolve(["slow"], tokens, np.array([7]))
    scorer.start_round(switch)
    assert switch.rounds[1][0] == 0  # the undecided draft went with its round


def test_rounds_are_due_every_n_steps():
    scorer = DraftScorer(K, 5)
    assert [scorer.round_due() for _ in range(11)] == [True, False, False, False, False] * 2 + [True]
    with pytest.raises(ValueError, match=">= max_k \\+ 1"):
        DraftScorer(K, K)


def test_scored_acceptance_is_unbiased_for_sampled_tokens():
    """A Markov chain sampled one token per step (as at k = 0); point-mass drafts of its likeliest path.
    The scored counts per position match the exact expectation, the sum over drafts of the product of
    the chain's probabilities of the draft tokens, which is what verification would accept."""
    rng = np.random.default_rng(0)
    vocab = 6
    chain = rng.dirichlet(np.full(vocab, 0.4), size=vocab)  # peaked rows: drafts often right
    likeliest = chain.argmax(axis=1)
    n_rows, steps = 32, 400
    tokens = np.zeros((n_rows, steps + 2), dtype=np.int64)
    lengths = np.ones(n_rows, dtype=np.int64)
    ids = list(range(n_rows))
    scorer = DraftScorer(K, K + 1)
    switch = Recorder()
    expected = np.zeros(K + 1)
    for _ in range(steps):
        scorer.resolve(ids, tokens, lengths)
        if scorer.round_due():
            scorer.start_round(switch)
            for r in ids:
                draft, prev, p = [], tokens[r, lengths[r] - 1], 1.0
                for j in range(1, K + 1):
                    nxt = likeliest[prev]
                    p *= chain[prev, nxt]
                    expected[j] += p
                    draft.append(nxt)
                    prev = nxt
                scorer.add(r, int(lengths[r]), np.array(draft))
        for r in ids:  # the engine emits one sampled token per row
            tokens[r, lengths[r]] = rng.choice(vocab, p=chain[tokens[r, lengths[r] - 1]])
            lengths[r] += 1
    scorer.resolve(ids, tokens, lengths)
    scorer.start_round(switch)
    accepted = sum(r[2] for r in switch.rounds)
    drafted = sum(r[1] for r in switch.rounds)
    rows = sum(r[0] for r in switch.rounds)
    assert rows == n_rows * (steps // (K + 1)) and drafted[1:].tolist() == [rows] * K
    for j in range(1, K + 1):
        sd = np.sqrt(expected[j])  # Poisson-binomial: variance below the mean
        assert abs(accepted[j] - expected[j]) < 4 * sd, (j, accepted[j], expected[j])
    assert accepted[1] > accepted[2] > accepted[3] > 0
