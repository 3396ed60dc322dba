"""Which trajectory a new request continues: a later turn of a multi-turn rollout, or a resumed partial one.

verl sends each turn of a tool agent loop, and each resume of an aborted partial rollout, to the engine
as a new request with a fresh id and a longer prompt: the trajectory's first prompt, what was generated
so far and the tool outputs between turns. A request continues a trajectory when its prompt starts with
a finished request's text (its trajectory's first prompt and a non-empty response): the sampled response
ties it to that trajectory, where a shared prefix alone (a common system prompt) does not. The
engine may have dropped up to `dropped_tokens` of that text's last tokens (drafts accepted past a stop
token or max_tokens in the request's last step reach the drafter, not the output), so the later prompt
must repeat the text without those (at least one response token).

`TrajectoryIndex` keeps the newest `capacity` finished texts. `find` is one pass over the new prompt
(a polynomial hash of each of its prefixes, in numpy) and one comparison per kept text (its length
and hash); BLAKE2b of the longest candidate confirms it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

import numpy as np

from .prompt_store import prompt_key

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: its powers mod 2**64 never vanish
_NONE = np.iinfo(np.int64).max  # the length of an absent prefix: longer than any prompt


class Trajectory(NamedTuple):
    """What a trajectory's later requests take from its first one."""

    prompt_length: int  # the first prompt's tokens: the key of its group and of its stored responses
    group: Hashable | None  # the group its first request started in (None: its own)
    with_store: bool  # whether the first request found the prompt's stored responses


class Continuation(NamedTuple):
    """A new request's trajectory, and the earlier request's response (its text after the first prompt):
    the new prompt repeats its first `earlier_length` tokens; `rest` are the others (which the engine may
    have dropped)."""

    trajectory: Trajectory
    earlier_length: int
    rest: np.ndarray

    def earlier_response(self, response: np.ndarray) -> np.ndarray:
        """The earlier request's response, from a response of the new request (which starts with it)."""
        return np.concatenate([response[: self.earlier_length], self.rest])


class TrajectoryIndex:
    """The newest `capacity` finished texts, each with its trajectory; see the module docstring."""

    def __init__(self, capacity: int, dropped_tokens: int) -> None:
        if capacity < 1 or dropped_tokens < 0:
            raise ValueError(
                f"TrajectoryIndex needs capacity >= 1 and dropped_tokens >= 0, got {capacity} and {dropped_tokens}"
            )
        self.capacity = capacity
        self.dropped_tokens = dropped_tokens
        # per slot, of its text without the last dropped_tokens (keeping a response token): the length,
        # the polynomial hash and the prompt_key; and the tokens past it
        self._lengths = np.full(capacity, _NONE, dtype=np.int64)
        self._hashes = np.zeros(capacity, dtype=np.uint64)
        self._keys: list[bytes | None] = [None] * capacity
        self._ends: list[np.ndarray | None] = [None] * capacity
        self._trajectories: list[Trajectory | None] = [None] * capacity
        self._added = 0  # texts added; the next goes to slot _added % capacity, over the oldest
        self._powers = np.ones(0, dtype=np.uint64)

    def __len__(self) -> int:
        return min(self._added, self.capacity)

    def add(self, prompt: np.ndarray, response: np.ndarray, trajectory: Trajectory) -> None:
        """A finished request's text: its trajectory's first prompt and everything after it. Nothing
        with an empty response: only a sampled token ties a later prompt to this trajectory."""
        if response.size == 0 or prompt.size == 0:
            return
        text = np.concatenate([prompt, response]).astype(np.int32, copy=False)
        tied = max(text.size - self.dropped_tokens, prompt.size + 1)  # what a later prompt must repeat
        slot = self._added % self.capacity
        self._lengths[slot] = tied
        self._hashes[slot] = self._prefix_hashes(text[:tied])[-1]
        self._keys[slot] = prompt_key(text[:tied])
        self._ends[slot] = text[tied:].copy()
        self._trajectories[slot] = trajectory
        self._added += 1

    def find(self, prompt: np.ndarray) -> Continuation | None:
        """The trajectory whose kept text `prompt` starts with (the longest such), or None."""
        if self._added == 0 or prompt.size == 0:
            return None
        slots = np.flatnonzero(self._lengths <= prompt.size)
        lengths = self._lengths[slots]
        same = self._prefix_hashes(prompt)[lengths - 1] == self._hashes[slots]
        for length, slot in sorted(zip(lengths[same].tolist(), slots[same].tolist()), reverse=True):
            if prompt_key(prompt[:length]) == self._keys[slot]:
                trajectory = self._trajectories[slot]
                return Continuation(trajectory, length - trajectory.prompt_length, self._ends[slot])
        return None

    def _prefix_hashes(self, tokens: np.ndarray) -> np.ndarray:
        """[j]: sum over i <= j of (tokens[i] + 1) * BASE**i, mod 2**64 (numpy's uint64 wraps)."""
        n = tokens.size
        if self._powers.size < n:  # [i]: BASE**i
            factors = np.full(max(n, 2 * self._powers.size), _BASE, dtype=np.uint64)
            factors[0] = 1
            self._powers = np.cumprod(factors)
        return np.cumsum((tokens.astype(np.uint64) + np.uint64(1)) * self._powers[:n])
