"""Scoring rounds: what full drafts would earn, measured whether or not they are sent.

Every ``every`` steps a round starts: the stepper takes a full draft (max_k tokens) for each decode row
and hands it here; later steps compare it with the tokens the engine emits at those positions. Between
round starts, the next steps' rows are scored as well until the round holds ``ROUND_ROWS`` drafts, so
that a small batch (the rollout's tail, one request at the end) is scored in every step, not one step
in ``every``; a row then has drafts of several steps undecided at once. A draft token matches the
emitted one with the target's probability of it, which is the probability that verification accepts
it (sampled or greedy; rejection sampling is lossless), so the counts are unbiased estimates of
acceptance per position also while nothing is drafted; with one draft per row and step scored, no row
or stretch of text weighs more than its steps do. A draft counts in the round in which it is decided.
The switch takes a full draft's first j positions as what a j-token draft earns; the drafter's
proposals of different lengths differ in a few percent of rows (``SamStepper._send``), a small
approximation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sam_rollout.drafter.auto_switch import ACCEPT_HALF_LIFE_ROWS

# rows a round scores at least, where the batch allows: the switch's estimate then decays per round
ROUND_ROWS = int(ACCEPT_HALF_LIFE_ROWS)


class DraftScorer:
    def __init__(self, max_k: int, every: int):
        if every < 1:
            raise ValueError(f"scoring rounds must be >= 1 step apart, got {every}")
        self.max_k = max_k
        self.every = every
        self._pending: dict = {}  # req_id -> [(tokens committed when drafted, draft tokens), ...]
        self._steps = 0
        self._clear_counts()

    def _clear_counts(self) -> None:
        self.added = 0  # drafts taken since the round started
        self.rows = 0  # drafts decided since the round started
        self.drafted_at = np.zeros(self.max_k + 1)  # [j]: scored drafts with a j-th token
        self.accepted_at = np.zeros(self.max_k + 1)  # [j]: ... that matched the emitted tokens up to j

    def round_due(self) -> bool:
        """Called once per step with decode rows: True on the steps that start a round."""
        due = self._steps % self.every == 0
        self._steps += 1
        return due

    def start_round(self, switch) -> None:
        """The finished round's counts go to the switch; drafts still undecided count in the round that
        decides them."""
        switch.observe_acceptance(self.rows, self.drafted_at, self.accepted_at)
        self._clear_counts()

    def discard_round(self) -> None:
        """Forget the round under way and the undecided drafts (speculation paused: their outcomes would
        span the pause)."""
        self._pending.clear()
        self._clear_counts()

    def rows_to_score(self, decode_rows: Sequence[int], round_start: bool) -> list[int]:
        """The decode rows to take a full draft for this step: all of them at a round's start; between
        round starts, as many as keep the round at ROUND_ROWS (a row may then have drafts of several
        steps undecided: each step's counts, so no row or stretch of text weighs more than its steps)."""
        rows = list(decode_rows)
        if round_start or not rows:
            return rows
        turn = self._steps % len(rows)  # a different first row each step: no row is favoured
        return (rows[turn:] + rows[:turn])[: max(ROUND_ROWS - self.added, 0)]

    def add(self, req_id, tokens_then: int, draft: np.ndarray) -> None:
        self.added += 1
        if draft.size == 0:  # nothing to draft from: counted as a row without drafts
            self.rows += 1
        else:
            self._pending.setdefault(req_id, []).append((int(tokens_then), np.array(draft, dtype=np.int64)))

    def drop(self, req_id) -> None:
        self._pending.pop(req_id, None)

    def resolve(self, req_ids: Sequence, token_ids: np.ndarray, lengths: np.ndarray) -> None:
        """Score every pending draft whose outcome the committed tokens now decide."""
        if not self._pending:
            return
        for i, rid in enumerate(req_ids):
            drafts = self._pending.get(rid)
            if drafts is None:
                continue
            undecided = [d for d in drafts if not self._decide(token_ids[i], int(lengths[i]), *d)]
            if undecided:
                self._pending[rid] = undecided
            else:
                del self._pending[rid]

    def _decide(self, tokens: np.ndarray, length: int, start: int, draft: np.ndarray) -> bool:
        """Count one draft if the row's committed tokens decide it (its first mismatch, or all of it)."""
        seen = min(length - start, draft.size)
        if seen <= 0:
            return False
        miss = np.flatnonzero(tokens[start : start + seen] != draft[:seen])
        if miss.size:
            accepted = int(miss[0])
        elif seen == draft.size:
            accepted = seen
        else:
            return False  # matches so far; the next tokens decide
        self.rows += 1
        self.drafted_at[1 : draft.size + 1] += 1
        self.accepted_at[1 : accepted + 1] += 1
        return True
