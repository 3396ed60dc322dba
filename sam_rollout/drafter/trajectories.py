"""Which trajectory a new request continues: a later turn of a multi-turn rollout, or a resumed partial one.

verl sends each turn of a tool agent loop, and each resume of an aborted partial rollout, to the engine
as a new request with a fresh id and a longer prompt: the trajectory's first prompt, what was generated
so far and the tool outputs between turns. A request continues a trajectory when its prompt starts with
a finished request's whole text (its trajectory's first prompt and a non-empty response): the sampled
response ties it to that trajectory, where a shared prefix alone (a common system prompt) does not.

`TrajectoryIndex` keeps the newest `capacity` finished texts. `find` is one pass over the new prompt
(a polynomial hash of each of its prefixes, in numpy) and one comparison per kept text (its length and
hash); BLAKE2b of the longest candidate confirms it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

import numpy as np

from .prompt_store import prompt_key

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: its powers mod 2**64 never vanish
_EMPTY = np.iinfo(np.int64).max  # the length of an empty slot: longer than any prompt


class Trajectory(NamedTuple):
    """What a trajectory's later requests take from its first one."""

    prompt_length: int  # the first prompt's tokens: the key of its group and of its stored responses
    group: Hashable | None  # the group its first request started in (None: its own)
    with_store: bool  # whether the first request found the prompt's stored responses


class TrajectoryIndex:
    """The newest `capacity` finished texts, each with its trajectory; see the module docstring."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"TrajectoryIndex needs capacity >= 1, got {capacity}")
        self.capacity = capacity
        self._lengths = np.full(capacity, _EMPTY, dtype=np.int64)  # per slot: its text's tokens
        self._hashes = np.zeros(capacity, dtype=np.uint64)  # per slot: its text's polynomial hash
        self._keys: list[bytes | None] = [None] * capacity  # per slot: prompt_key of its text
        self._trajectories: list[Trajectory | None] = [None] * capacity
        self._added = 0  # texts added; the next goes to slot _added % capacity, over the oldest
        self._powers = np.ones(0, dtype=np.uint64)

    def __len__(self) -> int:
        return min(self._added, self.capacity)

    def add(self, prompt: np.ndarray, response: np.ndarray, trajectory: Trajectory) -> None:
        """A finished request's text: its trajectory's first prompt and everything after it. Nothing
        with an empty response: only a sampled token ties a later prompt to this trajectory."""
        if response.size == 0:
            return
        text = np.concatenate([prompt, response]).astype(np.int32, copy=False)
        slot = self._added % self.capacity
        self._lengths[slot] = text.size
        self._hashes[slot] = self._prefix_hashes(text)[-1]
        self._keys[slot] = prompt_key(text)
        self._trajectories[slot] = trajectory
        self._added += 1

    def find(self, prompt: np.ndarray) -> Trajectory | None:
        """The trajectory whose newest kept text `prompt` starts with, or None."""
        if self._added == 0 or prompt.size == 0:
            return None
        prefix_hashes = self._prefix_hashes(prompt)  # [j]: of prompt[: j + 1]
        slots = np.flatnonzero(self._lengths <= prompt.size)
        lengths = self._lengths[slots]
        same = prefix_hashes[lengths - 1] == self._hashes[slots]
        for slot, length in sorted(zip(slots[same].tolist(), lengths[same].tolist()), key=lambda s: -s[1]):
            if prompt_key(prompt[:length]) == self._keys[slot]:
                return self._trajectories[slot]
        return None

    def _prefix_hashes(self, tokens: np.ndarray) -> np.ndarray:
        """[j]: sum over i <= j of (tokens[i] + 1) * BASE**i, mod 2**64 (numpy's uint64 wraps)."""
        n = tokens.size
        if self._powers.size < n:  # [i]: BASE**i
            factors = np.full(max(n, 2 * self._powers.size), _BASE, dtype=np.uint64)
            factors[0] = 1
            self._powers = np.cumprod(factors)
        return np.cumsum((tokens.astype(np.uint64) + np.uint64(1)) * self._powers[:n])
