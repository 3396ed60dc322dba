"""Compiled hot path: generalised suffix automata over flat int32 arrays, driven by numba.

Each automaton `a` owns three arrays, held in numba typed lists indexed by `a`:

- `states[a]`: int32, `STATE_WIDTH` fields per state: length, suffix link, `rep` (the log position
  of the state's first occurrence, i.e. min endpos in insertion order), and its edge block.
- `edges[a]`: int32 (token, target) pairs. Each state's out-edges live in one block. Blocks of
  1, 2, 4 or 8 pairs are scanned linearly (94% of states have one edge); larger blocks are
  open-addressing hash tables keyed by token, with a header pair holding the degree. Freed blocks go
  to per-class free lists.
- `logs[a]`: int32 token log in chunks of `CHUNK` slots; the last slot of a chunk links to the
  member's next chunk. A position's follower is the next slot, so a draft is a short walk, and a
  member that shares a position with another (siblings at the prompt's end) starts a chunk of its own.
  Empty slots hold -1.

Per-automaton counters live in `meta[a]` (int64); per-request cursors in `cursor[r]` (int64).
Functions that may grow an array re-read it from its typed list afterwards.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# --- states ---------------------------------------------------------------------------------
STATE_WIDTH = 4
S_LEN, S_LINK, S_REP, S_BLOCK = 0, 1, 2, 3
NO_BLOCK = -1

# --- edge blocks: block id = (size class << OFFSET_BITS) | offset in pairs --------------------
OFFSET_BITS = 26
OFFSET_MASK = (1 << OFFSET_BITS) - 1
MAX_LINEAR_CLASS = 3  # classes 0..3: 1, 2, 4, 8 pairs, scanned linearly
FIRST_HASH_CLASS = 5  # classes >= 5: 2**class slots plus a header pair, load kept <= 1/2
NUM_CLASSES = 24

# --- token log ------------------------------------------------------------------------------
CHUNK = 32  # slots per chunk; the last one links to the next chunk

# --- automaton meta fields --------------------------------------------------------------------
M_STATES = 0  # states used
M_PAIRS = 1  # edge pairs handed out by the bump allocator
M_LOG = 2  # log slots handed out
M_PROMPT_STATE = 3  # state of the shared prompt (group automata) or 0
M_PROMPT_POS = 4  # log position of the prompt's last token, -1 if empty
M_TOKENS = 5  # tokens appended to this automaton
M_FREE = 6  # first free-list head; NUM_CLASSES of them
META_WIDTH = M_FREE + NUM_CLASSES

# --- request cursor fields --------------------------------------------------------------------
R_AUTO = 0  # automaton of the request's group
R_STATE = 1  # state of the request's whole text
R_POS = 2  # log position of its last token, -1 if none
R_TOKENS = 3  # tokens seen, prompt included
R_FIRST = 4  # log position of its first response token, -1 if none yet
R_HIST = 5  # per history generation: (state, match length) pairs
NUM_HISTORY = 2
CURSOR_WIDTH = R_HIST + 2 * NUM_HISTORY

# --- draft sources ----------------------------------------------------------------------------
SOURCE_NONE, SOURCE_GROUP, SOURCE_HISTORY = 0, 1, 2

INITIAL_STATES = 64
INITIAL_PAIRS = 64
INITIAL_LOG = 4 * CHUNK
GROWTH = 1.25  # modest growth keeps slack (and bytes per token) low; still amortised O(1)


def new_automaton_arrays(expected_tokens: int = 0):
    """Fresh arrays for one automaton: a root state and nothing else."""
    n = max(expected_tokens, 1)
    states = np.empty(max(INITIAL_STATES, 2 * n) * STATE_WIDTH, dtype=np.int32)
    states[:STATE_WIDTH] = (0, -1, -1, NO_BLOCK)
    edges = np.empty(max(INITIAL_PAIRS, 2 * n + 16) * 2, dtype=np.int32)
    log = np.full(max(INITIAL_LOG, (n // (CHUNK - 1) + 2) * CHUNK), -1, dtype=np.int32)
    meta = np.zeros(META_WIDTH, dtype=np.int64)
    meta[M_STATES] = 1
    meta[M_PROMPT_POS] = -1
    meta[M_FREE:] = -1
    return states, edges, log, meta


@njit(cache=True, inline="always")
def _grown(size, need):
    new = int(size * GROWTH) + 16
    return need if need > new else new


# ============================================================================ edge blocks ======
@njit(cache=True, inline="always")
def _class_pairs(cls):
    return (1 << cls) if cls <= MAX_LINEAR_CLASS else (1 << cls) + 1


@njit(cache=True, inline="always")
def _hash_slot(token, mask):
    return ((token * 0x9E3779B1) >> 7) & mask


@njit(cache=True)
def _alloc_block(edge_lists, meta, a, cls):
    size = _class_pairs(cls)
    edges = edge_lists[a]
    head = meta[a, M_FREE + cls]
    if head >= 0:
        meta[a, M_FREE + cls] = edges[2 * head]  # a free block keeps the next free one in its token slot
        off = head
    else:
        off = meta[a, M_PAIRS]
        need = off + size
        if 2 * need > edges.size:
            bigger = np.empty(2 * _grown(edges.size // 2, need), dtype=np.int32)
            bigger[: 2 * off] = edges[: 2 * off]
            edge_lists[a] = bigger
            edges = bigger
        meta[a, M_PAIRS] = need
    edges[2 * off : 2 * (off + size)] = -1
    if cls > MAX_LINEAR_CLASS:
        edges[2 * off] = 0  # header: degree
    return (cls << OFFSET_BITS) | off


@njit(cache=True)
def _free_block(edge_lists, meta, a, block):
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    edge_lists[a][2 * off] = meta[a, M_FREE + cls]
    meta[a, M_FREE + cls] = off


@njit(cache=True)
def get_edge(edges, block, token):
    """Target of `token` from a state with edge block `block`, or -1."""
    if block == NO_BLOCK:
        return -1
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    if cls <= MAX_LINEAR_CLASS:
        for i in range(off, off + (1 << cls)):
            t = edges[2 * i]
            if t == token:
                return edges[2 * i + 1]
            if t < 0:
                return -1
        return -1
    mask = (1 << cls) - 1
    base = off + 1
    i = _hash_slot(token, mask)
    while True:
        t = edges[2 * (base + i)]
        if t == token:
            return edges[2 * (base + i) + 1]
        if t < 0:
            return -1
        i = (i + 1) & mask


@njit(cache=True)
def _block_degree(edges, block):
    if block == NO_BLOCK:
        return 0
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    if cls > MAX_LINEAR_CLASS:
        return edges[2 * off]
    n = 0
    for i in range(off, off + (1 << cls)):
        if edges[2 * i] < 0:
            break
        n += 1
    return n


@njit(cache=True)
def _block_put(edges, block, token, target):
    """Set token -> target in a block known to have room. Returns 1 if the edge is new."""
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    if cls <= MAX_LINEAR_CLASS:
        for i in range(off, off + (1 << cls)):
            t = edges[2 * i]
            if t == token or t < 0:
                edges[2 * i] = token
                edges[2 * i + 1] = target
                return 1 if t < 0 else 0
        return -1  # unreachable when the caller made room
    mask = (1 << cls) - 1
    base = off + 1
    i = _hash_slot(token, mask)
    while True:
        t = edges[2 * (base + i)]
        if t == token or t < 0:
            edges[2 * (base + i)] = token
            edges[2 * (base + i) + 1] = target
            if t < 0:
                edges[2 * off] += 1
                return 1
            return 0
        i = (i + 1) & mask


@njit(cache=True)
def _class_for_degree(degree):
    if degree <= 1:
        return 0
    if degree <= 8:
        cls = 0
        while (1 << cls) < degree:
            cls += 1
        return cls
    cls = FIRST_HASH_CLASS
    while (1 << cls) < 2 * degree:
        cls += 1
    return cls


@njit(cache=True)
def _copy_edges(edges, src_block, dst_block):
    cls = src_block >> OFFSET_BITS
    off = src_block & OFFSET_MASK
    if cls <= MAX_LINEAR_CLASS:
        for i in range(off, off + (1 << cls)):
            if edges[2 * i] < 0:
                break
            _block_put(edges, dst_block, edges[2 * i], edges[2 * i + 1])
    else:
        for i in range(off + 1, off + 1 + (1 << cls)):
            if edges[2 * i] >= 0:
                _block_put(edges, dst_block, edges[2 * i], edges[2 * i + 1])


@njit(cache=True)
def set_edge(state_lists, edge_lists, meta, a, s, token, target):
    """Add or redirect the edge s --token--> target, growing the state's block when full."""
    states = state_lists[a]
    block = states[s * STATE_WIDTH + S_BLOCK]
    edges = edge_lists[a]
    if block != NO_BLOCK:
        degree = _block_degree(edges, block)
        cls = block >> OFFSET_BITS
        full = degree >= (1 << cls) if cls <= MAX_LINEAR_CLASS else 2 * (degree + 1) > (1 << cls)
        if not full or get_edge(edges, block, token) >= 0:
            _block_put(edges, block, token, target)
            return
        new_block = _alloc_block(edge_lists, meta, a, _class_for_degree(degree + 1))
        edges = edge_lists[a]
        _copy_edges(edges, block, new_block)
        _free_block(edge_lists, meta, a, block)
    else:
        new_block = _alloc_block(edge_lists, meta, a, 0)
        edges = edge_lists[a]
    _block_put(edges, new_block, token, target)
    states[s * STATE_WIDTH + S_BLOCK] = new_block


# ============================================================================ states ===========
@njit(cache=True)
def _new_state(state_lists, meta, a, length, link, rep):
    n = meta[a, M_STATES]
    states = state_lists[a]
    if (n + 1) * STATE_WIDTH > states.size:
        bigger = np.empty(_grown(states.size // STATE_WIDTH, n + 1) * STATE_WIDTH, dtype=np.int32)
        bigger[: n * STATE_WIDTH] = states[: n * STATE_WIDTH]
        state_lists[a] = bigger
        states = bigger
    b = n * STATE_WIDTH
    states[b + S_LEN] = length
    states[b + S_LINK] = link
    states[b + S_REP] = rep
    states[b + S_BLOCK] = NO_BLOCK
    meta[a, M_STATES] = n + 1
    return n


@njit(cache=True)
def _clone(state_lists, edge_lists, meta, a, q, length):
    states = state_lists[a]
    c = _new_state(state_lists, meta, a, length, states[q * STATE_WIDTH + S_LINK], states[q * STATE_WIDTH + S_REP])
    states = state_lists[a]
    block = states[q * STATE_WIDTH + S_BLOCK]
    if block != NO_BLOCK:
        copy = _alloc_block(edge_lists, meta, a, block >> OFFSET_BITS)
        _copy_edges(edge_lists[a], block, copy)
        states[c * STATE_WIDTH + S_BLOCK] = copy
    return c


@njit(cache=True)
def _redirect(state_lists, edge_lists, meta, a, p, token, q, clone):
    """Point every edge p --token--> q up the suffix-link path at clone instead."""
    states = state_lists[a]
    while p != -1 and get_edge(edge_lists[a], states[p * STATE_WIDTH + S_BLOCK], token) == q:
        set_edge(state_lists, edge_lists, meta, a, p, token, clone)
        p = states[p * STATE_WIDTH + S_LINK]


@njit(cache=True)
def extend_state(state_lists, edge_lists, meta, a, last, token, pos):
    """Generalised online SAM extension of the text ending in `last` by `token` at log `pos`.

    Returns the state of the extended text. Amortised O(1) per token.
    """
    states = state_lists[a]
    last_len = states[last * STATE_WIDTH + S_LEN]
    q = get_edge(edge_lists[a], states[last * STATE_WIDTH + S_BLOCK], token)
    if q >= 0:  # the extended text already occurs (another member wrote it): reuse or split
        if states[q * STATE_WIDTH + S_LEN] == last_len + 1:
            return q
        clone = _clone(state_lists, edge_lists, meta, a, q, last_len + 1)
        _redirect(state_lists, edge_lists, meta, a, last, token, q, clone)
        states = state_lists[a]
        states[q * STATE_WIDTH + S_LINK] = clone
        return clone
    cur = _new_state(state_lists, meta, a, last_len + 1, 0, pos)
    states = state_lists[a]
    p = last
    while p != -1 and get_edge(edge_lists[a], states[p * STATE_WIDTH + S_BLOCK], token) < 0:
        set_edge(state_lists, edge_lists, meta, a, p, token, cur)
        p = states[p * STATE_WIDTH + S_LINK]
    if p != -1:
        q = get_edge(edge_lists[a], states[p * STATE_WIDTH + S_BLOCK], token)
        if states[p * STATE_WIDTH + S_LEN] + 1 == states[q * STATE_WIDTH + S_LEN]:
            states[cur * STATE_WIDTH + S_LINK] = q
        else:
            clone = _clone(state_lists, edge_lists, meta, a, q, states[p * STATE_WIDTH + S_LEN] + 1)
            _redirect(state_lists, edge_lists, meta, a, p, token, q, clone)
            states = state_lists[a]
            states[q * STATE_WIDTH + S_LINK] = clone
            states[cur * STATE_WIDTH + S_LINK] = clone
    return cur


# ============================================================================ token log ========
@njit(cache=True, inline="always")
def follower(log, pos):
    """Log position after `pos` in the same member's text (may be an empty slot), or -1."""
    if pos < 0:
        return -1
    nxt = pos + 1
    if nxt % CHUNK == CHUNK - 1:
        return log[nxt]
    return nxt


@njit(cache=True)
def _new_chunk(log_lists, meta, a):
    off = meta[a, M_LOG]
    log = log_lists[a]
    if off + CHUNK > log.size:
        bigger = np.full(_grown(log.size // CHUNK, off // CHUNK + 1) * CHUNK, -1, dtype=np.int32)
        bigger[:off] = log[:off]
        log_lists[a] = bigger
    meta[a, M_LOG] = off + CHUNK
    return off


@njit(cache=True)
def write_token(log_lists, meta, a, pos, token):
    """Write `token` after log position `pos` (-1: a fresh start) and return its position.

    The slot after `pos` is taken when another member already continued from there; then the
    writer starts a chunk of its own, linked from nowhere (its earlier text lives in the shared part).
    """
    log = log_lists[a]
    nxt = -1
    if pos >= 0:
        nxt = pos + 1
        if nxt % CHUNK == CHUNK - 1:  # end of chunk: follow or create the link
            link = log[nxt]
            if link < 0:
                link = _new_chunk(log_lists, meta, a)
                log = log_lists[a]
                log[nxt] = link
            nxt = link
        if log[nxt] >= 0:
            nxt = -1
    if nxt < 0:
        nxt = _new_chunk(log_lists, meta, a)
        log = log_lists[a]
    log[nxt] = token
    meta[a, M_TOKENS] += 1
    return nxt


@njit(cache=True)
def continuation_length(log, pos, k):
    n = 0
    p = follower(log, pos)
    while n < k and p >= 0 and log[p] >= 0:
        n += 1
        p = follower(log, p)
    return n


@njit(cache=True)
def copy_continuation(log, pos, count, out):
    p = follower(log, pos)
    for i in range(count):
        out[i] = log[p]
        p = follower(log, p)


# ============================================================================ requests =========
@njit(cache=True)
def append_to_member(state_lists, edge_lists, log_lists, meta, a, state, pos, token):
    """Append one token to a member's text: log it, then extend the automaton."""
    new_pos = write_token(log_lists, meta, a, pos, token)
    return extend_state(state_lists, edge_lists, meta, a, state, token, new_pos), new_pos


@njit(cache=True)
def _track(states, edges, cursor, r, field, token):
    """Advance a request's match in a (read-only) history automaton by one token."""
    v = cursor[r, field]
    length = cursor[r, field + 1]
    while True:
        nxt = get_edge(edges, states[v * STATE_WIDTH + S_BLOCK], token)
        if nxt >= 0:
            cursor[r, field] = nxt
            cursor[r, field + 1] = length + 1
            return
        if v == 0:
            cursor[r, field] = 0
            cursor[r, field + 1] = 0
            return
        v = states[v * STATE_WIDTH + S_LINK]
        length = states[v * STATE_WIDTH + S_LEN]


@njit(cache=True)
def _normalise(states, v, length):
    """The state that holds the suffix of `length` ending in state v's class, after later splits."""
    while v > 0 and length <= states[states[v * STATE_WIDTH + S_LINK] * STATE_WIDTH + S_LEN]:
        v = states[v * STATE_WIDTH + S_LINK]
    return v


@njit(cache=True)
def append_tokens(state_lists, edge_lists, log_lists, meta, cursor, history, r, tokens, start, stop):
    """Append tokens[start:stop] to request r (its group automaton and its history matches)."""
    a = cursor[r, R_AUTO]
    state = cursor[r, R_STATE]
    pos = cursor[r, R_POS]
    first = cursor[r, R_FIRST]
    for j in range(start, stop):
        token = tokens[j]
        state, pos = append_to_member(state_lists, edge_lists, log_lists, meta, a, state, pos, token)
        if first < 0:
            first = pos
        for g in range(NUM_HISTORY):
            h = history[g]
            if h >= 0:
                hs = state_lists[h]
                field = R_HIST + 2 * g
                cursor[r, field] = _normalise(hs, cursor[r, field], cursor[r, field + 1])
                _track(hs, edge_lists[h], cursor, r, field, token)
    cursor[r, R_STATE] = state
    cursor[r, R_POS] = pos
    cursor[r, R_FIRST] = first
    cursor[r, R_TOKENS] += stop - start


@njit(cache=True)
def first_invalid(tokens, start, stop):
    for j in range(start, stop):
        if tokens[j] < 0:
            return j
    return -1


@njit(cache=True)
def sync_rows(state_lists, edge_lists, log_lists, meta, cursor, history, slots, rows, row_lengths):
    """Append rows[i, seen:row_lengths[i]] to request slots[i], for the whole batch.

    Checks every row first: returns the batch index of the first row that is shorter than what was
    already seen or holds a negative id, and then appends nothing. Returns -1 on success.
    """
    for i in range(slots.size):
        seen = cursor[slots[i], R_TOKENS]
        if row_lengths[i] < seen or row_lengths[i] > rows.shape[1] or first_invalid(rows[i], seen, row_lengths[i]) >= 0:
            return i
    for i in range(slots.size):
        r = slots[i]
        append_tokens(state_lists, edge_lists, log_lists, meta, cursor, history, r, rows[i], cursor[r, R_TOKENS], row_lengths[i])
    return -1


@njit(cache=True)
def extend_flat(state_lists, edge_lists, log_lists, meta, cursor, history, slots, tokens, offsets):
    """Append tokens[offsets[i]:offsets[i+1]] to request slots[i] (validated by the caller)."""
    for i in range(slots.size):
        append_tokens(state_lists, edge_lists, log_lists, meta, cursor, history, slots[i], tokens, offsets[i], offsets[i + 1])


@njit(cache=True)
def insert_text(state_lists, edge_lists, log_lists, meta, a, tokens):
    """Insert a text as a new member starting empty (a group's prompt, a finished response).

    Returns the state and log position of its end."""
    state, pos = 0, -1
    for j in range(tokens.size):
        state, pos = append_to_member(state_lists, edge_lists, log_lists, meta, a, state, pos, tokens[j])
    return state, pos


@njit(cache=True)
def track_history(state_lists, edge_lists, cursor, history, r, tokens):
    """Advance request r's history matches over tokens it already holds (its prompt)."""
    for g in range(NUM_HISTORY):
        h = history[g]
        if h < 0:
            continue
        field = R_HIST + 2 * g
        for j in range(tokens.size):
            _track(state_lists[h], edge_lists[h], cursor, r, field, tokens[j])


@njit(cache=True)
def read_tokens(log, pos, count, out):
    """out[:count] = the member's tokens from log position pos on."""
    for i in range(count):
        out[i] = log[pos]
        pos = follower(log, pos)


# ============================================================================ drafting =========
@njit(cache=True)
def _best_in(states, log, v, length, k):
    """Walk from (v, length) towards the root until a first occurrence has a follower.

    Returns (match length, position, available tokens)."""
    while v > 0:
        pos = states[v * STATE_WIDTH + S_REP]
        n = continuation_length(log, pos, k)
        if n > 0:
            return length, pos, n
        v = states[v * STATE_WIDTH + S_LINK]
        length = states[v * STATE_WIDTH + S_LEN]
    return 0, -1, 0


@njit(cache=True)
def draft_length(match, k, min_match, scaled):
    """How many tokens to draft for a match: nothing below min_match; with `scaled`, one token per
    matched token beyond min_match - 1, capped at k."""
    if match < min_match or match == 0:
        return 0
    if scaled:
        n = match - min_match + 1
        return n if n < k else k
    return k


@njit(cache=True)
def propose_batch(state_lists, log_lists, cursor, history, slots, k, min_match, scaled, use_history, out, out_len, out_match, out_source):
    """Drafts for requests slots[i] into out[i, :out_len[i]]; the longest match among the group
    automaton and the history generations wins (ties: group first, newer history next)."""
    for i in range(slots.size):
        r = slots[i]
        a = cursor[r, R_AUTO]
        best, best_pos, best_n = _best_in(state_lists[a], log_lists[a], cursor[r, R_STATE],
                                          state_lists[a][cursor[r, R_STATE] * STATE_WIDTH + S_LEN], k)
        best_auto = a
        source = SOURCE_GROUP if best > 0 else SOURCE_NONE
        if use_history:
            for g in range(NUM_HISTORY):
                h = history[g]
                if h < 0:
                    continue
                hs = state_lists[h]
                field = R_HIST + 2 * g
                v = _normalise(hs, cursor[r, field], cursor[r, field + 1])
                m, pos, n = _best_in(hs, log_lists[h], v, cursor[r, field + 1], k)
                if m > best:
                    best, best_pos, best_n, best_auto, source = m, pos, n, h, SOURCE_HISTORY
        count = draft_length(best, k, min_match, scaled)
        if count > best_n:
            count = best_n
        out_match[i] = best
        out_source[i] = source if count > 0 else SOURCE_NONE
        out_len[i] = count
        if count > 0:
            copy_continuation(log_lists[best_auto], best_pos, count, out[i])
