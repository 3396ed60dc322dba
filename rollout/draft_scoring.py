"""Scoring rounds: what full drafts would earn, measured whether or not they are sent.

Every ``every`` steps the stepper takes a full draft (max_k tokens) for each decode row and hands it
here; later steps compare it with the tokens the engine emitted at those positions. A draft token
matches the emitted one with the target's probability of it, which is the probability that
verification accepts it (sampled or greedy; rejection sampling is lossless), so the counts are
unbiased estimates of acceptance per position also while nothing is drafted. A round's counts go to
the switch when the next round starts; at k = 0 every draft of a round is decided by then. The switch
takes a full draft's first j positions as what a j-token draft earns; the drafter's proposals of
different lengths differ in a few percent of rows (``SamStepper._propose``), a small approximation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class DraftScorer:
    def __init__(self, max_k: int, every: int):
        if every < max_k + 1:
            raise ValueError(f"scoring rounds must be >= max_k + 1 = {max_k + 1} steps apart, got {every}")
        self.max_k = max_k
        self.every = every
        self._pending: dict = {}  # req_id -> (tokens committed when drafted, draft tokens)
        self._steps = 0
        self._clear_counts()

    def _clear_counts(self) -> None:
        self.rows = 0
        self.drafted_at = np.zeros(self.max_k + 1)  # [j]: scored drafts with a j-th token
        self.accepted_at = np.zeros(self.max_k + 1)  # [j]: ... that matched the emitted tokens up to j

    def round_due(self) -> bool:
        """Called once per step with decode rows: True on the steps that start a round."""
        due = self._steps % self.every == 0
        self._steps += 1
        return due

    def start_round(self, switch) -> None:
        """The finished round's counts go to the switch; drafts still undecided (a row that was not
        scheduled since) are dropped."""
        switch.observe_acceptance(self.rows, self.drafted_at, self.accepted_at)
        self.discard_round()

    def discard_round(self) -> None:
        """Forget the round under way (speculation paused: its outcomes would span the pause)."""
        self._pending.clear()
        self._clear_counts()

    def add(self, req_id, tokens_then: int, draft: np.ndarray) -> None:
        if draft.size == 0:  # nothing to draft from: counted as a row without drafts
            self.rows += 1
        else:
            self._pending[req_id] = (int(tokens_then), np.array(draft, dtype=np.int64))

    def drop(self, req_id) -> None:
        self._pending.pop(req_id, None)

    def resolve(self, req_ids: Sequence, token_ids: np.ndarray, lengths: np.ndarray) -> None:
        """Score every pending draft whose outcome the committed tokens now decide."""
        if not self._pending:
            return
        for i, rid in enumerate(req_ids):
            pending = self._pending.get(rid)
            if pending is None:
                continue
            start, draft = pending
            seen = min(int(lengths[i]) - start, draft.size)
            if seen <= 0:
                continue
            miss = np.flatnonzero(token_ids[i, start : start + seen] != draft[:seen])
            if miss.size:
                accepted = int(miss[0])
            elif seen == draft.size:
                accepted = seen
            else:
                continue  # matches so far; the next tokens decide
            del self._pending[rid]
            self.rows += 1
            self.drafted_at[1 : draft.size + 1] += 1
            self.accepted_at[1 : accepted + 1] += 1
