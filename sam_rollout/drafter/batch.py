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

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

from . import build, draft, layout, token_log
from .config import COUNTED_CONTINUATIONS, DraftConfig
from .pages import int32_array
from .prompt_store import PromptStore
from .trajectories import Continuation

_INT32_MAX = np.iinfo(np.int32).max


class Proposal(NamedTuple):
    """Drafts for one batch; row i belongs to the i-th requested id."""

    tokens: np.ndarray  # int32 [batch, k], padded with -1
    lengths: np.ndarray  # int32 [batch]: tokens drafted
    match_lengths: np.ndarray  # int32 [batch]: length of the matched suffix behind each draft
    sources: np.ndarray  # int8 [batch]: SOURCE_NONE, SOURCE_GROUP, SOURCE_HISTORY or SOURCE_STORE


SOURCE_NONE, SOURCE_GROUP, SOURCE_HISTORY, SOURCE_STORE = (
    layout.SOURCE_NONE,
    layout.SOURCE_GROUP,
    layout.SOURCE_HISTORY,
    layout.SOURCE_STORE,
)


def policy_array(config: DraftConfig) -> np.ndarray:
    """The drafting settings as the compiled core reads them (draft.P_* fields)."""
    policy = np.zeros(draft.POLICY_WIDTH, dtype=np.float64)
    policy[draft.P_MIN_MATCH] = config.min_match
    policy[draft.P_SCALED] = config.length_policy == "scaled"
    policy[draft.P_FREQUENT] = config.continuation in COUNTED_CONTINUATIONS
    policy[draft.P_ADAPTIVE] = config.continuation == "adaptive"
    gated = config.length_policy == "confidence" or (config.length_policy == "match" and config.continuation != "first")
    policy[draft.P_MIN_PROB] = config.min_token_prob if gated else 0.0
    policy[draft.P_MATCH] = config.length_policy == "match"
    policy[draft.P_BASE_K] = config.base_k
    policy[draft.P_MATCH_SCALE] = config.match_scale
    policy[draft.P_PRIOR] = config.count_prior
    policy[draft.P_LONG_MATCH] = config.long_match
    policy[draft.P_COUNT_DEPTH] = layout.count_depth(config.long_match) if policy[draft.P_FREQUENT] else 0
    return policy


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
    """Owner of every automaton's arrays; compiled code reaches them through `table`."""

    def __init__(self, recency_weight: float) -> None:
        self._recency_percent = round(100 * recency_weight)  # how count_occurrence reads it
        self.arrays: list[list[np.ndarray]] = []  # per automaton: [states, edges, log]
        self.table = np.zeros((0, layout.TABLE_WIDTH), dtype=np.int64)
        self.meta = np.zeros((0, layout.META_WIDTH), dtype=np.int64)
        self._free: list[int] = []

    def new(self, expected_tokens: int = 0) -> int:
        states, edges, log, meta = layout.new_automaton_arrays(expected_tokens, self._recency_percent)
        if self._free:
            a = self._free.pop()
        else:
            a = len(self.arrays)
            self.arrays.append([])
            if a >= self.meta.shape[0]:
                n = max(8, 2 * a)
                self.meta = np.concatenate([self.meta, np.zeros((n - a, layout.META_WIDTH), dtype=np.int64)])
                self.table = np.concatenate([self.table, np.zeros((n - a, layout.TABLE_WIDTH), dtype=np.int64)])
        self.arrays[a] = [states, edges, log]
        for field in (layout.T_STATES, layout.T_EDGES, layout.T_LOG):
            self._publish(a, field)
        self.meta[a] = meta
        return a

    def free(self, a: int) -> None:
        self.table[a] = 0  # before the arrays go: compiled code must never see a dangling address
        self.arrays[a] = []
        self.meta[a] = 0
        self._free.append(a)

    def grow(self, need: np.ndarray) -> None:
        """Grow automaton need[0]'s arrays to at least need[1:] elements (by 1.25x at least)."""
        a = int(need[0])
        for field, length in zip((layout.T_STATES, layout.T_EDGES, layout.T_LOG), need[1:]):
            old = self.arrays[a][field]
            if length > old.size:
                bigger = int32_array(max(int(length), int(old.size * layout.GROWTH) + 16))
                bigger[: old.size] = old
                if field == layout.T_LOG:
                    bigger[old.size :] = -1  # empty log slots
                self.arrays[a][field] = bigger
                self._publish(a, field)

    def _publish(self, a: int, field: int) -> None:
        array = self.arrays[a][field]
        self.table[a, 2 * field] = array.ctypes.data
        self.table[a, 2 * field + 1] = array.size

    def nbytes(self, a: int) -> int:
        return sum(x.nbytes for x in self.arrays[a]) + self.meta[a].nbytes + self.table[a].nbytes

    def tokens(self, a: int) -> int:
        return int(self.meta[a, layout.M_TOKENS])

    def log(self, a: int) -> np.ndarray:
        return self.arrays[a][layout.T_LOG]


class Finished(NamedTuple):
    """A finished request's trajectory: its first prompt, and everything after it up to this request's end
    (a continuation's earlier turns and tool outputs, then its own tokens)."""

    prompt: np.ndarray
    response: np.ndarray


class _Group:
    __slots__ = ("automaton", "prompt", "members", "store")

    def __init__(self, automaton: int, prompt: np.ndarray) -> None:
        self.automaton = automaton
        self.prompt = prompt
        self.members = 0
        self.store = -1  # automaton of the prompt's stored responses (prompt store), -1 if none


class BatchDrafter:
    """SAM drafter for a batch of requests. See the module docstring for the life cycle."""

    def __init__(self, config: DraftConfig | None = None) -> None:
        self.config = config or DraftConfig()
        self._automata = _Automata(self.config.recency_weight)
        self._cursor = np.zeros((16, layout.CURSOR_WIDTH), dtype=np.int64)
        self._free_slots = list(range(15, -1, -1))
        self._slot: dict[Hashable, int] = {}
        self._group_of: dict[Hashable, Hashable] = {}
        # a live request that continues a trajectory: where, and its prompt's tokens past the first prompt
        self._continues: dict[Hashable, tuple[Continuation, int]] = {}
        self._groups: dict[Hashable, _Group] = {}
        self._history = np.full(layout.NUM_HISTORY, -1, dtype=np.int64)  # newest generation first
        self._need = np.zeros(layout.NEED_WIDTH, dtype=np.int64)
        self._policy = policy_array(self.config)
        self._count_depth = int(self._policy[draft.P_COUNT_DEPTH])
        self._work = np.zeros(draft.WORK_WIDTH, dtype=np.int64)
        self._scratch = np.zeros(max(self.config.k, 1), dtype=np.int32)
        self.prompt_store = (
            PromptStore(self.config.prompt_store_bytes, self.config.prompt_store_tokens)
            if self.config.prompt_store
            else None
        )
        if self.config.history_tokens > 0:
            self._history[0] = self._automata.new()

    # ------------------------------------------------------------------ life cycle --------------
    def start(
        self, req_id: Hashable, prompt, group: Hashable | None = None, continues: Continuation | None = None
    ) -> bool:
        """Begin a request. Siblings pass the same `group` and must pass the same prompt. With the
        prompt store on, a new group's automaton also gets the stored responses to its prompt.
        A request that continues a trajectory (a later turn, a resumed partial rollout) passes where
        (`sam_rollout.drafter.trajectories`): its first prompt's tokens of `prompt` are the group's
        prompt and name its stored responses (looked up without counting a visit), and the rest (the
        trajectory's text so far) is the request's own text, as if it had generated it. Returns whether
        the request drafts from stored responses (its group found some)."""
        if req_id in self._slot:
            raise ValueError(f"request {req_id!r} was already started")
        prompt = as_token_array(prompt, f"prompt of request {req_id!r}")
        first = prompt if continues is None else self._first_prompt(req_id, prompt, continues)
        key = ("group", group) if (group is not None and self.config.group_aware) else ("own", req_id)
        entry = self._groups.get(key)
        if entry is None:
            entry = _Group(self._automata.new(len(first)), first.copy())
            a = entry.automaton
            self._automata.meta[a, layout.M_PROMPT : layout.M_PROMPT + layout.MEMBER_WIDTH] = self._insert(a, first)
            entry.store = self._stored_responses(first, visit=continues is None)
            self._groups[key] = entry
        elif not np.array_equal(entry.prompt, first):
            raise ValueError(f"request {req_id!r} joins group {group!r} with a different prompt than its siblings")
        entry.members += 1
        slot = self._take_slot()
        a = entry.automaton
        row = self._cursor[slot]
        row[:] = 0
        row[layout.R_AUTO] = a
        row[layout.R_MEMBER : layout.R_MEMBER + layout.MEMBER_WIDTH] = self._automata.meta[
            a, layout.M_PROMPT : layout.M_PROMPT + layout.MEMBER_WIDTH
        ]
        row[layout.R_TOKENS] = len(first)
        row[layout.R_FIRST] = -1
        row[layout.R_GUESS] = -1
        row[layout.R_STORE_AUTO] = entry.store
        if entry.store >= 0:  # the prompt is matched in full there
            row[layout.R_STORE] = self._automata.meta[entry.store, layout.M_PROMPT + layout.MB_STATE]
            row[layout.R_STORE + 1] = len(first)
        self._slot[req_id] = slot
        self._group_of[req_id] = key
        build.track_history(self._automata.table, self._cursor, self._history, slot, first)
        if continues is not None:
            self._continues[req_id] = (continues, len(prompt) - len(first))
            self.extend([req_id], prompt[len(first) :], [len(prompt) - len(first)])
        return entry.store >= 0

    @staticmethod
    def _first_prompt(req_id: Hashable, prompt: np.ndarray, continues: Continuation) -> np.ndarray:
        length, earlier = continues.trajectory.prompt_length, continues.earlier_length
        if not 0 < length <= length + earlier <= len(prompt):
            raise ValueError(
                f"request {req_id!r} continues a trajectory of a {length}-token first prompt and {earlier} more "
                f"tokens, which its {len(prompt)}-token prompt cannot hold"
            )
        return prompt[:length]

    def finish(self, req_id: Hashable, keep: bool = True) -> Finished:
        """End a request and free what only it used; what it generated joins the history, and its
        trajectory's text after the first prompt the prompt store (replacing that trajectory's earlier
        part there), if enabled. keep=False drops them (a request about to be restarted from its
        row: its full text arrives when it really finishes, so keeping this part would store it twice).
        Returns the trajectory's first prompt and text after it."""
        slot = self._slot_of(req_id)
        key = self._group_of.pop(req_id)
        entry = self._groups[key]
        continues, own_start = self._continues.pop(req_id, (None, 0))
        response = self._response(slot, len(entry.prompt))
        if keep:
            self._keep_response(entry.prompt, response, continues, own_start)
        del self._slot[req_id]
        entry.members -= 1
        if entry.members == 0:
            self._automata.free(entry.automaton)
            if entry.store >= 0:
                self._automata.free(entry.store)
            del self._groups[key]
        self._free_slots.append(slot)
        return Finished(entry.prompt, response)

    def load_prompt_store(self, path: str) -> str | None:
        """Replace the prompt store by the one saved at `path` (`PromptStore.load`, fitted to this
        config's budget and cap). Returns None, or why the store starts empty. Live requests keep the
        stored responses their group got at start; what they finish goes to the new store."""
        if self.prompt_store is None:
            raise ValueError("load_prompt_store needs the prompt store on (DraftConfig.prompt_store)")
        self.prompt_store, problem = PromptStore.load(
            path, self.config.prompt_store_bytes, self.config.prompt_store_tokens
        )
        return problem

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
        progress = np.zeros(slots.size, dtype=np.int64)
        self._until_done(
            build.extend_flat,
            self._cursor,
            self._history,
            slots,
            tokens,
            offsets,
            progress,
            self._need,
            self._count_depth,
        )

    def sync(self, req_ids: Sequence[Hashable], rows: np.ndarray, row_lengths) -> None:
        """Bring each request up to rows[i, :row_lengths[i]] (its prompt plus accepted tokens) by
        appending what it has not seen yet. rows is a 2-D integer array such as vLLM's token_ids_cpu.
        Every row is checked first; on a bad row nothing is appended."""
        slots, row_lengths = self._check_rows(req_ids, rows, row_lengths)
        code = self._until_done(
            build.sync_rows, self._cursor, self._history, slots, rows, row_lengths, self._need, self._count_depth
        )
        self._raise_bad_row(code, req_ids, slots, rows, row_lengths)

    def propose(self, req_ids: Sequence[Hashable], k: int | None = None) -> Proposal:
        """Drafts of at most k tokens (default config.k) for each request, from the current state."""
        k = self._check_k(self.config.k if k is None else k)
        slots = self._slots_of(req_ids)
        out = self._empty_proposal(slots.size, k)
        if k > 0 and slots.size > 0:
            a = self._automata
            draft.propose_batch(a.table, a.meta, self._cursor, self._history, slots, k, *self._buffers(k), *out)
        return out

    def step(
        self, req_ids: Sequence[Hashable], rows: np.ndarray, row_lengths, k: int | None = None, propose=None
    ) -> Proposal:
        """`sync` then `propose` in one compiled call: an engine's step. propose: the indices into
        req_ids of the requests to draft for (Proposal row j for req_ids[propose[j]]); None: all."""
        k = self._check_k(self.config.k if k is None else k)
        slots, row_lengths = self._check_rows(req_ids, rows, row_lengths)
        proposing = slots if propose is None else slots[self._check_indices(propose, slots.size)]
        out = self._empty_proposal(proposing.size, k)
        buffers = self._buffers(k)
        code = self._until_done(
            draft.step_rows,
            self._cursor,
            self._history,
            slots,
            rows,
            row_lengths,
            self._need,
            k,
            proposing,
            *buffers,
            *out,
        )
        self._raise_bad_row(code, req_ids, slots, rows, row_lengths)
        return out

    # ------------------------------------------------------------------ inspection -------------
    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    def num_tokens(self, req_id: Hashable) -> int:
        """Tokens seen for a request, prompt included."""
        return int(self._cursor[self._slot_of(req_id), layout.R_TOKENS])

    @property
    def nbytes(self) -> int:
        """Bytes held by live automata (groups, their stored responses, history) and the request
        table; the prompt store's own bytes are `prompt_store.nbytes`."""
        autos = {g.automaton for g in self._groups.values()} | {int(h) for h in self._history if h >= 0}
        autos |= {g.store for g in self._groups.values() if g.store >= 0}
        return sum(self._automata.nbytes(a) for a in autos) + self._cursor.nbytes

    @property
    def history_tokens(self) -> int:
        return sum(self._automata.tokens(int(h)) for h in self._history if h >= 0)

    # ------------------------------------------------------------------ internals --------------
    def _until_done(self, kernel, *args) -> int:
        """Call a kernel that may stop for room (GROW) until it finishes; it resumes by itself."""
        while True:
            code = kernel(self._automata.table, self._automata.meta, *args)
            if code != layout.GROW:
                return code
            self._automata.grow(self._need)

    def _insert(self, a: int, tokens: np.ndarray, member: np.ndarray | None = None) -> np.ndarray:
        """Insert a whole text into automaton a as a fresh member, or continuing `member` (a cursor,
        updated); returns the cursor at its end."""
        member = layout.new_member() if member is None else member
        done = 0
        while True:
            done = build.insert_text(
                self._automata.table, self._automata.meta, a, tokens, done, member, self._need, self._count_depth
            )
            if done == tokens.size:
                return member
            self._automata.grow(self._need)

    def _buffers(self, k: int):
        """(policy, work, scratch) for a compiled call drafting at most k tokens."""
        if self._scratch.size < k:
            self._scratch = np.zeros(k, dtype=np.int32)
        return self._policy, self._work, self._scratch

    @staticmethod
    def _check_k(k) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k must be a non-negative integer, got {k!r}")
        return int(k)

    @staticmethod
    def _check_indices(indices, n: int) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            raise ValueError(f"propose holds an index outside the {n} requests: {indices.tolist()}")
        return indices

    @staticmethod
    def _empty_proposal(n: int, k: int) -> Proposal:
        return Proposal(
            np.full((n, k), -1, dtype=np.int32),
            np.zeros(n, dtype=np.int32),
            np.zeros(n, dtype=np.int32),
            np.zeros(n, dtype=np.int8),
        )

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
        if bad >= 0:  # a row index; OK (-1) otherwise
            seen = int(self._cursor[slots[bad], layout.R_TOKENS])
            raise ValueError(
                f"row {bad} for request {req_ids[bad]!r} is invalid: length {int(row_lengths[bad])} "
                f"(seen {seen}, row width {rows.shape[1]}) or a negative token id; nothing was appended"
            )

    def _slot_of(self, req_id: Hashable) -> int:
        try:
            return self._slot[req_id]
        except KeyError:
            raise KeyError(f"unknown request {req_id!r} (never started, or already finished)") from None

    def _slots_of(self, req_ids: Sequence[Hashable]) -> np.ndarray:
        slot = self._slot
        try:
            return np.array([slot[r] for r in req_ids], dtype=np.int64).reshape(-1)
        except KeyError as e:
            self._slot_of(e.args[0])  # raises the named error
            raise

    def _take_slot(self) -> int:
        if not self._free_slots:
            n = self._cursor.shape[0]
            grown = np.zeros((2 * n, layout.CURSOR_WIDTH), dtype=np.int64)
            grown[:n] = self._cursor
            self._cursor = grown
            self._free_slots = list(range(2 * n - 1, n - 1, -1))
        return self._free_slots.pop()

    def _stored_responses(self, prompt: np.ndarray, visit: bool) -> int:
        """An automaton of the prompt and its stored responses (each continuing the prompt), or -1
        when the prompt store is off or holds none. `visit`: count the lookup (`PromptStore.responses`)."""
        responses = self.prompt_store.responses(prompt, visit) if self.prompt_store is not None else []
        if not responses:
            return -1
        a = self._automata.new(len(prompt) + sum(r.size for r in responses))
        at_prompt = self._insert(a, prompt)
        self._automata.meta[a, layout.M_PROMPT : layout.M_PROMPT + layout.MEMBER_WIDTH] = at_prompt
        for response in responses:
            self._insert(a, response, at_prompt.copy())
        return a

    def _response(self, slot: int, prompt_length: int) -> np.ndarray:
        """The tokens a request generated (read back from its automaton's log)."""
        row = self._cursor[slot]
        response = np.empty(max(int(row[layout.R_TOKENS]) - prompt_length, 0), dtype=np.int32)
        if response.size:
            token_log.read_tokens(
                self._automata.log(int(row[layout.R_AUTO])), int(row[layout.R_FIRST]), response.size, response
            )
        return response

    def _keep_response(
        self, prompt: np.ndarray, response: np.ndarray, continues: Continuation | None, own_start: int
    ) -> None:
        """A finished response feeds the history (what this request generated: from `own_start`, past the
        trajectory a continuation started with) and, keyed by its first prompt, the prompt store (all of
        it, replacing the trajectory's earlier text there)."""
        if self.config.history_tokens > 0:
            self._add_to_history(response[own_start:])
        if self.prompt_store is not None:
            replaces = continues.earlier_response(response) if continues is not None else None
            self.prompt_store.add(prompt, response, replaces=replaces)

    def _add_to_history(self, response: np.ndarray) -> None:
        count = response.size
        if count == 0 or count > self.config.history_tokens // 2:
            return  # nothing generated, or a single response larger than a history generation
        if self._automata.tokens(int(self._history[0])) + count > self.config.history_tokens // 2:
            self._rotate_history()
        self._insert(int(self._history[0]), response)

    def _rotate_history(self) -> None:
        """Drop the oldest generation; the newest becomes the older one; start an empty newest."""
        oldest = int(self._history[-1])
        if oldest >= 0:
            self._automata.free(oldest)
        self._history[1:] = self._history[:-1]
        self._history[0] = self._automata.new()
        live = np.fromiter(self._slot.values(), dtype=np.int64, count=len(self._slot))
        hist = self._cursor[:, layout.R_HIST : layout.R_HIST + 2 * layout.NUM_HISTORY]
        hist[live, 2:] = hist[live, :-2]
        hist[live, :2] = 0
