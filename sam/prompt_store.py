"""Prompt store: finished responses of earlier visits to a prompt, offered to its next visit.

RL passes over the same prompts many times (an epoch of DAPO-Math-17k is 35 steps at 512 prompts a
step), and the rollout engine lives across steps. A global history holds only the last few steps, so
the responses to a prompt's previous visit are gone by its next one; this store keeps them per
prompt, as raw tokens, within a byte budget.

- Key: a 16-byte BLAKE2b digest of the prompt's int32 tokens (a collision could only make drafts
  worse, never outputs: every draft is verified).
- Per prompt, the newest responses up to `tokens_per_prompt` tokens (older ones of that prompt go
  first; a longer response keeps its beginning, where the next visit's drafts start).
- Over the byte budget, whole prompts go, least recently updated first.
- `nbytes` counts the token arrays, the keys and a fixed allowance per prompt and per response for the
  Python objects around them (measured by tests/test_prompt_store.py with tracemalloc).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import asdict, dataclass

import numpy as np

ENTRY_OVERHEAD_BYTES = 400  # per prompt: the key object, the entry and its list, the dict slot
RESPONSE_OVERHEAD_BYTES = 120  # per response: the array object and its list slot


@dataclass
class PromptStoreStats:
    """Counters since the store was made, and what it holds now."""

    hits: int = 0  # visits that found earlier responses
    misses: int = 0  # visits that found none
    offered_tokens: int = 0  # tokens handed to visits
    added_responses: int = 0
    evicted_prompts: int = 0  # dropped for the byte budget
    dropped_responses: int = 0  # dropped for a prompt's token cap or with an evicted prompt
    prompts: int = 0
    responses: int = 0
    tokens: int = 0
    nbytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class _Entry:
    __slots__ = ("responses", "tokens")

    def __init__(self) -> None:
        self.responses: list[np.ndarray] = []
        self.tokens = 0


def prompt_key(prompt: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(prompt, dtype=np.int32).tobytes(), digest_size=16).digest()


class PromptStore:
    """Finished responses per prompt, within `budget_bytes`; see the module docstring."""

    def __init__(self, budget_bytes: int, tokens_per_prompt: int) -> None:
        if budget_bytes <= 0 or tokens_per_prompt <= 0:
            raise ValueError(
                f"PromptStore needs budget_bytes > 0 and tokens_per_prompt > 0, got {budget_bytes} and "
                f"{tokens_per_prompt}"
            )
        self.budget_bytes = budget_bytes
        self.tokens_per_prompt = tokens_per_prompt
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._stats = PromptStoreStats()

    def responses(self, prompt: np.ndarray) -> list[np.ndarray]:
        """The stored responses to this prompt (oldest first) for a new visit; counts a hit or miss."""
        entry = self._entries.get(prompt_key(prompt))
        if entry is None:
            self._stats.misses += 1
            return []
        self._stats.hits += 1
        self._stats.offered_tokens += entry.tokens
        return list(entry.responses)

    def add(self, prompt: np.ndarray, response: np.ndarray) -> None:
        """Keep a finished response (copied) as the newest of its prompt; evict to stay in budget."""
        if response.size == 0:
            return
        response = np.array(response[: self.tokens_per_prompt], dtype=np.int32)
        key = prompt_key(prompt)
        entry = self._entries.pop(key, None)
        if entry is None:
            entry = _Entry()
            self._stats.prompts += 1
            self._stats.nbytes += len(key) + ENTRY_OVERHEAD_BYTES
        self._entries[key] = entry  # the most recently updated prompt goes last
        entry.responses.append(response)
        entry.tokens += response.size
        self._account(1, response.size)
        self._stats.added_responses += 1
        while entry.tokens > self.tokens_per_prompt:
            old = entry.responses.pop(0)
            entry.tokens -= old.size
            self._account(-1, -old.size)
            self._stats.dropped_responses += 1
        while self._stats.nbytes > self.budget_bytes and self._entries:
            self._evict_oldest()

    def stats(self) -> PromptStoreStats:
        return PromptStoreStats(**asdict(self._stats))

    @property
    def nbytes(self) -> int:
        return self._stats.nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def _account(self, responses: int, tokens: int) -> None:
        self._stats.responses += responses
        self._stats.tokens += tokens
        self._stats.nbytes += responses * RESPONSE_OVERHEAD_BYTES + tokens * 4

    def _evict_oldest(self) -> None:
        key, entry = self._entries.popitem(last=False)
        self._account(-len(entry.responses), -entry.tokens)
        self._stats.nbytes -= len(key) + ENTRY_OVERHEAD_BYTES
        self._stats.prompts -= 1
        self._stats.evicted_prompts += 1
        self._stats.dropped_responses += len(entry.responses)
