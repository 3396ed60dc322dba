"""Batch drafter: many requests, one compiled call per batch (arrays in, arrays out).

Life cycle: `start` (prompt, optional group) -> `sync`/`extend` (accepted tokens) -> `propose`
-> ... -> `finish`. Siblings started with the same group share one generalised automaton, so each
drafts from the prompt, its own text and its siblings' text, whichever matches longest. With
`history_tokens > 0`, finished responses also feed a history of two automaton generations; the older
one is dropped when the newer fills half the budget.

All drafts for a step must be proposed before any request of that step is extended: that is what an
engine does (one forward pass verifies the whole batch), and what keeps group replay honest.
"""

from __future__ import annotations

from typing import Hashable, NamedTuple, Sequence

import numpy as np
from numba import typed, types

from . import _core as core
from .config import DraftConfig

_INT32_MAX = np.iinfo(np.int32).max
_ARRAY = types.int32[::1]


class Proposal(NamedTuple):
    """Drafts for one batch; row i belongs to the i-th requested id."""

    tokens: np.ndarray  # int32 [batch, k], padded with -1
    lengths: np.ndarray  # int32 [batch]: tokens drafted
    match_lengths: np.ndarray  # int32 [batch]: length of the matched suffix behind each draft
    sources: np.ndarray  # int8 [batch]: SOURCE_NONE, SOURCE_GROUP or SOURCE_HISTORY


SOURCE_NONE, SOURCE_GROUP, SOURCE_HISTORY = core.SOURCE_NONE, core.SOURCE_GROUP, core.SOURCE_HISTORY


def as_token_array(tokens, what: str = "tokens") -> np.ndarray:
    """A 1-D int32 copy-free view of token ids, or ValueError naming what is wrong."""
    arr = np.asarray(tokens)
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be integer token ids, got dtype {arr.dtype}")
    low, high = int(arr.min()), int(arr.max())
    if low < 0:
        raise ValueError(f"{what} holds a negative token id ({low})")
    if high > _INT32_MAX:
        raise ValueError(f"{what} holds a token id too large for int32 ({high})")
    return np.ascontiguousarray(arr, dtype=np.int32)


class _Automata:
    """The typed lists of per-automaton arrays, with reuse of freed ids."""

    def __init__(self) -> None:
        self.states = typed.List.empty_list(_ARRAY)
        self.edges = typed.List.empty_list(_ARRAY)
        self.logs = typed.List.empty_list(_ARRAY)
        self.meta = np.zeros((0, core.META_WIDTH), dtype=np.int64)
        self._free: list[int] = []

    def new(self, expected_tokens: int = 0) -> int:
        states, edges, log, meta = core.new_automaton_arrays(expected_tokens)
        if self._free:
            a = self._free.pop()
            self.states[a], self.edges[a], self.logs[a] = states, edges, log
        else:
            a = len(self.states)
            self.states.append(states)
            self.edges.append(edges)
            self.logs.append(log)
            if a >= self.meta.shape[0]:
                grown = np.zeros((max(8, 2 * a), core.META_WIDTH), dtype=np.int64)
                grown[:a] = self.meta[:a]
                self.meta = grown
        self.meta[a] = meta
        return a

    def free(self, a: int) -> None:
        empty = np.empty(0, dtype=np.int32)
        self.states[a], self.edges[a], self.logs[a] = empty, empty, empty
        self.meta[a] = 0
        self._free.append(a)

    def nbytes(self, a: int) -> int:
        return self.states[a].nbytes + self.edges[a].nbytes + self.logs[a].nbytes + self.meta[a].nbytes

    def tokens(self, a: int) -> int:
        return int(self.meta[a, core.M_TOKENS])


class _Group:
    __slots__ = ("automaton", "prompt", "members")

    def __init__(self, automaton: int, prompt: np.ndarray) -> None:
        self.automaton = automaton
        self.prompt = prompt
        self.members = 0


class BatchDrafter:
    """SAM drafter for a batch of requests. See the module docstring for the life cycle."""

    def __init__(self, config: DraftConfig | None = None) -> None:
        self.config = config or DraftConfig()
        self._automata = _Automata()
        self._cursor = np.zeros((16, core.CURSOR_WIDTH), dtype=np.int64)
        self._free_slots = list(range(15, -1, -1))
        self._slot: dict[Hashable, int] = {}
        self._group_of: dict[Hashable, Hashable] = {}
        self._groups: dict[Hashable, _Group] = {}
        self._history = np.full(core.NUM_HISTORY, -1, dtype=np.int64)  # newest generation first
        if self.config.history_tokens > 0:
            self._history[0] = self._automata.new()

    # ------------------------------------------------------------------ life cycle --------------
    def start(self, req_id: Hashable, prompt, group: Hashable | None = None) -> None:
        """Begin a request. Siblings pass the same `group` and must pass the same prompt."""
        if req_id in self._slot:
            raise ValueError(f"request {req_id!r} was already started")
        prompt = as_token_array(prompt, f"prompt of request {req_id!r}")
        key = ("group", group) if (group is not None and self.config.group_aware) else ("own", req_id)
        entry = self._groups.get(key)
        if entry is None:
            entry = _Group(self._automata.new(len(prompt)), prompt.copy())
            a = entry.automaton
            state, pos = core.insert_text(*self._arrays(), a, prompt)
            self._automata.meta[a, core.M_PROMPT_STATE] = state
            self._automata.meta[a, core.M_PROMPT_POS] = pos
            self._groups[key] = entry
        elif not np.array_equal(entry.prompt, prompt):
            raise ValueError(f"request {req_id!r} joins group {group!r} with a different prompt than its siblings")
        entry.members += 1
        slot = self._take_slot()
        a = entry.automaton
        row = self._cursor[slot]
        row[:] = 0
        row[core.R_AUTO] = a
        row[core.R_STATE] = self._automata.meta[a, core.M_PROMPT_STATE]
        row[core.R_POS] = self._automata.meta[a, core.M_PROMPT_POS]
        row[core.R_TOKENS] = len(prompt)
        row[core.R_FIRST] = -1
        self._slot[req_id] = slot
        self._group_of[req_id] = key
        core.track_history(*self._arrays()[:3], self._cursor, self._history, slot, prompt)

    def finish(self, req_id: Hashable) -> None:
        """End a request and free what only it used; its response joins the history if enabled."""
        slot = self._slot_of(req_id)
        key = self._group_of.pop(req_id)
        entry = self._groups[key]
        if self.config.history_tokens > 0:
            self._add_to_history(slot, len(entry.prompt))
        del self._slot[req_id]
        entry.members -= 1
        if entry.members == 0:
            self._automata.free(entry.automaton)
            del self._groups[key]
        self._free_slots.append(slot)

    # ------------------------------------------------------------------ tokens -----------------
    def extend(self, req_ids: Sequence[Hashable], tokens, counts) -> None:
        """Append counts[i] tokens from the flat `tokens` to req_ids[i], for the whole batch."""
        slots = self._slots_of(req_ids)
        tokens = as_token_array(tokens)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        if counts.size != slots.size:
            raise ValueError(f"counts has {counts.size} entries for {slots.size} requests")
        if counts.size and counts.min() < 0:
            raise ValueError("counts must be >= 0")
        offsets = np.zeros(slots.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if offsets[-1] != tokens.size:
            raise ValueError(f"counts add up to {int(offsets[-1])} but {tokens.size} tokens were given")
        core.extend_flat(*self._arrays(), self._cursor, self._history, slots, tokens, offsets)

    def sync(self, req_ids: Sequence[Hashable], rows: np.ndarray, row_lengths) -> None:
        """Bring each request up to rows[i, :row_lengths[i]] (its prompt plus accepted tokens) by
        appending what it has not seen yet. rows is a 2-D integer array such as vLLM's token_ids_cpu.
        Every row is checked first; on a bad row nothing is appended."""
        slots, row_lengths = self._check_rows(req_ids, rows, row_lengths)
        bad = core.sync_rows(*self._arrays(), self._cursor, self._history, slots, rows, row_lengths)
        self._raise_bad_row(bad, req_ids, slots, rows, row_lengths)

    def propose(self, req_ids: Sequence[Hashable], k: int | None = None) -> Proposal:
        """Drafts of at most k tokens (default config.k) for each request, from the current state."""
        k = self._check_k(self.config.k if k is None else k)
        slots = self._slots_of(req_ids)
        out = self._empty_proposal(slots.size, k)
        if k > 0 and slots.size > 0:
            core.propose_batch(*self._arrays()[:3], self._cursor, self._history, slots, k, *self._policy(), *out)
        return out

    def step(self, req_ids: Sequence[Hashable], rows: np.ndarray, row_lengths, k: int | None = None) -> Proposal:
        """`sync` then `propose` in one compiled call: an engine's step."""
        k = self._check_k(self.config.k if k is None else k)
        slots, row_lengths = self._check_rows(req_ids, rows, row_lengths)
        out = self._empty_proposal(slots.size, k)
        bad = core.step_rows(*self._arrays(), self._cursor, self._history, slots, rows, row_lengths, k,
                             *self._policy(), *out)
        self._raise_bad_row(bad, req_ids, slots, rows, row_lengths)
        return out

    # ------------------------------------------------------------------ inspection -------------
    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    def num_tokens(self, req_id: Hashable) -> int:
        """Tokens seen for a request, prompt included."""
        return int(self._cursor[self._slot_of(req_id), core.R_TOKENS])

    @property
    def nbytes(self) -> int:
        """Bytes held by live automata (groups and history) and the request table."""
        autos = {g.automaton for g in self._groups.values()} | {int(h) for h in self._history if h >= 0}
        return sum(self._automata.nbytes(a) for a in autos) + self._cursor.nbytes

    @property
    def history_tokens(self) -> int:
        return sum(self._automata.tokens(int(h)) for h in self._history if h >= 0)

    # ------------------------------------------------------------------ internals --------------
    def _arrays(self):
        a = self._automata
        return a.states, a.edges, a.logs, a.meta

    def _policy(self):
        cfg = self.config
        return cfg.min_match, cfg.length_policy == "scaled", cfg.history_tokens > 0

    @staticmethod
    def _check_k(k) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k must be a non-negative integer, got {k!r}")
        return int(k)

    @staticmethod
    def _empty_proposal(n: int, k: int) -> Proposal:
        return Proposal(np.full((n, k), -1, dtype=np.int32), np.zeros(n, dtype=np.int32),
                        np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int8))

    def _check_rows(self, req_ids, rows, row_lengths):
        slots = self._slots_of(req_ids)
        if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.dtype.kind not in "iu":
            raise ValueError("rows must be a 2-D integer numpy array")
        if rows.shape[0] < slots.size:
            raise ValueError(f"rows has {rows.shape[0]} rows for {slots.size} requests")
        row_lengths = np.asarray(row_lengths, dtype=np.int64).reshape(-1)
        if row_lengths.size != slots.size:
            raise ValueError(f"row_lengths has {row_lengths.size} entries for {slots.size} requests")
        return slots, row_lengths

    def _raise_bad_row(self, bad, req_ids, slots, rows, row_lengths) -> None:
        if bad >= 0:
            seen = int(self._cursor[slots[bad], core.R_TOKENS])
            raise ValueError(f"row {bad} for request {req_ids[bad]!r} is invalid: length {int(row_lengths[bad])} "
                             f"(seen {seen}, row width {rows.shape[1]}) or a negative token id; nothing was appended")

    def _slot_of(self, req_id: Hashable) -> int:
        try:
            return self._slot[req_id]
        except KeyError:
            raise KeyError(f"unknown request {req_id!r} (never started, or already finished)") from None

    def _slots_of(self, req_ids: Sequence[Hashable]) -> np.ndarray:
        return np.fromiter((self._slot_of(r) for r in req_ids), dtype=np.int64, count=len(req_ids))

    def _take_slot(self) -> int:
        if not self._free_slots:
            n = self._cursor.shape[0]
            grown = np.zeros((2 * n, core.CURSOR_WIDTH), dtype=np.int64)
            grown[:n] = self._cursor
            self._cursor = grown
            self._free_slots = list(range(2 * n - 1, n - 1, -1))
        return self._free_slots.pop()

    def _add_to_history(self, slot: int, prompt_length: int) -> None:
        row = self._cursor[slot]
        count = int(row[core.R_TOKENS]) - prompt_length
        if count <= 0 or count > self.config.history_tokens // 2:
            return  # nothing generated, or a single response larger than a history generation
        response = np.empty(count, dtype=np.int32)
        core.read_tokens(self._automata.logs[int(row[core.R_AUTO])], int(row[core.R_FIRST]), count, response)
        if self._automata.tokens(int(self._history[0])) + count > self.config.history_tokens // 2:
            self._rotate_history()
        core.insert_text(*self._arrays(), int(self._history[0]), response)

    def _rotate_history(self) -> None:
        """Drop the oldest generation; the newest becomes the older one; start an empty newest."""
        oldest = int(self._history[-1])
        if oldest >= 0:
            self._automata.free(oldest)
        self._history[1:] = self._history[:-1]
        self._history[0] = self._automata.new()
        live = np.fromiter(self._slot.values(), dtype=np.int64, count=len(self._slot))
        hist = self._cursor[:, core.R_HIST:]
        hist[live, 2:] = hist[live, :-2]
        hist[live, :2] = 0
