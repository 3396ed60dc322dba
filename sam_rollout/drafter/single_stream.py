"""`SuffixAutomaton`: one token stream, drafting from its own past. A thin wrapper over the batch core."""

from __future__ import annotations

import numpy as np

from .batch import BatchDrafter
from .config import DraftConfig

_ONLY = 0


class SuffixAutomaton:
    """Dynamic suffix automaton over integer token ids.

    `draft(k)` returns the (at most k) tokens that followed the first earlier occurrence of the
    longest suffix that occurred before; `match_length` is that suffix's length.
    """

    def __init__(self, tokens=None) -> None:
        self._drafter = BatchDrafter(DraftConfig(k=0, length_policy="fixed", group_aware=False, continuation="first"))
        self._drafter.start(_ONLY, tokens if tokens is not None else [])
        self.match_length = 0

    def extend(self, tokens) -> None:
        """Append token ids (a list or a 1-D integer numpy array)."""
        tokens = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
        self._drafter.extend([_ONLY], tokens, [tokens.size])

    def draft(self, k: int) -> np.ndarray:
        proposal = self._drafter.propose([_ONLY], k)
        self.match_length = int(proposal.match_lengths[0])
        return proposal.tokens[0, : proposal.lengths[0]].copy()

    def __len__(self) -> int:
        return self._drafter.num_tokens(_ONLY)

    @property
    def nbytes(self) -> int:
        return self._drafter.nbytes
