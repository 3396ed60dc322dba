"""Compiled hot path: generalised suffix automata over flat int32 arrays, driven by numba.

Each automaton `a` has three int32 arrays, owned by Python (`sam_rollout.drafter.batch._Automata`; large ones in huge
pages, `sam_rollout.drafter.pages`) and reached from compiled code through `table[a]`, which holds each array's address
and length:

- `states[a]`: int32, `STATE_WIDTH` fields per state: length, suffix link, `rep` (the log position
  of the state's first occurrence, i.e. min endpos in insertion order), its first out-edge inline
  (token, target; 94% of states have exactly one edge, so a walk rarely leaves the state record),
  the block holding its other edges, and `count`, its number of end positions (occurrences).
- `edges[a]`: int32 (token, target) pairs for the edges beyond the first. Blocks of 1, 2, 4 or 8
  pairs are scanned linearly; larger blocks are open-addressing hash tables keyed by token, with a
  header pair holding the degree. Freed blocks go to per-class free lists.
- `logs[a]`: int32 token log in chunks of `CHUNK` slots; the last slot of a chunk links to the
  member's next chunk. A position's follower is the next slot, so a draft is a short walk, and a
  member that shares a position with another (siblings at the prompt's end) starts a chunk of its own.
  Empty slots hold -1.

Per-automaton counters live in `meta[a]` (int64); per-request cursors in `cursor[r]` (int64).

Counts are kept only where they are cheap: for states holding a string of at most `depth` tokens
(`count_depth(long_match)`, a setting of the drafter, fixed for its automata). Each member (a request's
text, a prompt, a finished response) keeps a cursor on the state of its last min(depth, length)
tokens; an append walks from there to the root adding one occurrence, then walks the previous
cursor's path to keep each state's inline edge on its most frequent continuation, or on a recent one
whose count comes close (`count_occurrence`). That bounds the work per token by 2 * depth states (at
most 42), whatever the context length.

The adaptive policy keeps, per request, the first tokens of its last draft's two candidates (first
occurrence, frequent; `R_GUESS`); the next append scores them (`score_guesses`) into decayed wins in
the group automaton's meta (`M_WINS`), which decide the next drafts.

Drafting reaches its sources (group, stored responses, history generations) by automaton id through
`table`, never by indexing a tuple of arrays at run time: numba copies such a tuple and counts
references on every access, which cost more than the whole draft.

Compiled code never allocates. A kernel that runs out of room stops between tokens, writes what it
needs into `need`, and returns GROW; Python grows the arrays and calls it again, and it resumes where
it stopped. (Numba's typed lists cost ~35 ns an access, and a numba function that returns an array
into a loop ~30 ns a call: both would dominate a step.)
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from .pages import int32_array

# --- states ---------------------------------------------------------------------------------
STATE_WIDTH = 7
S_LEN, S_LINK, S_REP, S_TOKEN, S_TARGET, S_BLOCK, S_COUNT = 0, 1, 2, 3, 4, 5, 6
NO_EDGE = -1
NO_BLOCK = -1

# --- occurrence counts ------------------------------------------------------------------------
MAX_LONG_MATCH = 16  # frequent policy: matches longer than `long_match` (at most this) follow their first occurrence
DRAFT_REACH = 4  # scored drafts of up to DRAFT_REACH + 1 tokens from a long_match-token match stay on counted states


def score_depth(long_match: int) -> int:
    """States holding a string this short keep their most frequent continuation inline."""
    return long_match + DRAFT_REACH


def count_depth(long_match: int) -> int:
    """States holding a string this short keep their occurrence count."""
    return score_depth(long_match) + 1


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
M_PROMPT = 3  # the shared prompt's member cursor (MEMBER_WIDTH fields; group automata)
M_TOKENS = 7  # tokens appended to this automaton
M_RECENCY = 8  # recency weight, in percent: see count_occurrence
M_WINS = 9  # adaptive: decayed wins of (first occurrence, frequent) where their first tokens differ
M_FREE = 11  # first free-list head; NUM_CLASSES of them
META_WIDTH = M_FREE + NUM_CLASSES

# --- member cursor: where one text (a request, a prompt, a finished response) ends -------------
MB_STATE = 0  # state of the whole text
MB_POS = 1  # log position of its last token, -1 if none
MB_BOUND = 2  # state of its last min(depth, length) tokens (where counting starts)
MB_BOUND_LEN = 3  # that length
MEMBER_WIDTH = 4

# --- request cursor fields --------------------------------------------------------------------
R_AUTO = 0  # automaton of the request's group
R_MEMBER = 1  # the request's member cursor (MEMBER_WIDTH fields)
R_TOKENS = R_MEMBER + MEMBER_WIDTH  # tokens seen, prompt included
R_FIRST = R_TOKENS + 1  # log position of its first response token, -1 if none yet
R_HIST = R_FIRST + 1  # per history generation: (state, match length) pairs
NUM_HISTORY = 2
R_STORE = R_HIST + 2 * NUM_HISTORY  # (state, match length) in the group's stored-responses automaton
R_STORE_AUTO = R_STORE + 2  # that automaton, -1 if none
R_GUESS = R_STORE_AUTO + 1  # adaptive: (tokens seen, first occurrence's, frequent's first token) at the last draft
CURSOR_WIDTH = R_GUESS + 3

# --- draft sources ----------------------------------------------------------------------------
SOURCE_NONE, SOURCE_GROUP, SOURCE_HISTORY, SOURCE_STORE = 0, 1, 2, 3

# --- the array table: per automaton, (address, length) of its states, edges and log ------------
T_STATES, T_EDGES, T_LOG = 0, 1, 2
TABLE_WIDTH = 6

# --- kernel answers; `need` = (automaton, states length, edges length, log length) -------------
OK, GROW = -1, -2
NEED_WIDTH = 4

INITIAL_STATES = 64
INITIAL_PAIRS = 64
INITIAL_LOG = 4 * CHUNK
GROWTH = 1.25  # modest growth keeps slack (and bytes per token) low; still amortised O(1)


def new_automaton_arrays(expected_tokens: int = 0, recency_percent: int = 100):
    """Fresh arrays for one automaton: a root state and nothing else. `recency_percent`: the recency
    weight in percent (count_occurrence)."""
    n = max(expected_tokens, 1)
    # Sized for typical text (~1.8 states and ~0.3 extra edges per token); growth covers the rest.
    states = int32_array(max(INITIAL_STATES, n * 15 // 8) * STATE_WIDTH)
    states[:STATE_WIDTH] = (0, -1, -1, NO_EDGE, -1, NO_BLOCK, 0)
    edges = int32_array(max(INITIAL_PAIRS, n // 3) * 2)
    log = int32_array(max(INITIAL_LOG, (n // (CHUNK - 1) + 2) * CHUNK))
    log[:] = -1  # empty slots
    meta = np.zeros(META_WIDTH, dtype=np.int64)
    meta[M_STATES] = 1
    meta[M_PROMPT + MB_POS] = -1
    meta[M_RECENCY] = recency_percent
    meta[M_FREE:] = -1
    return states, edges, log, meta


def new_member():
    """The cursor of a text that has not started: no state beyond the root, no log position."""
    member = np.zeros(MEMBER_WIDTH, dtype=np.int64)
    member[MB_POS] = -1
    return member


@intrinsic
def _int32_pointer(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int32)))

    return types.CPointer(types.int32)(types.int64), codegen


@njit(cache=True, inline="always")
def view(table, a, field):
    """Automaton a's states, edges or log array (kept alive by Python while listed in the table)."""
    return carray(_int32_pointer(table[a, 2 * field]), (table[a, 2 * field + 1],))


@njit(cache=True, inline="always")
def _ask(need, a, states, edges, log):
    need[0], need[1], need[2], need[3] = a, states, edges, log
    return GROW


@njit(cache=True, inline="always")
def _log_room(tokens):
    """Log slots one member may take for `tokens` more tokens: a chunk per CHUNK - 1 tokens, a fresh
    chunk when it cannot continue in place, and a link chunk."""
    return (tokens // (CHUNK - 1) + 2) * CHUNK


# ============================================================================ edge blocks ======
@njit(cache=True, inline="always")
def _class_pairs(cls):
    return (1 << cls) if cls <= MAX_LINEAR_CLASS else (1 << cls) + 1


@njit(cache=True, inline="always")
def _hash_slot(token, mask):
    return ((token * 0x9E3779B1) >> 7) & mask


@njit(cache=True)
def _alloc_block(edges, m, cls):
    """A cleared block of size class cls (room reserved by the caller). Returns its block id."""
    size = _class_pairs(cls)
    head = m[M_FREE + cls]
    if head >= 0:
        m[M_FREE + cls] = edges[2 * head]  # a free block keeps the next free one in its token slot
        off = head
    else:
        off = m[M_PAIRS]
        m[M_PAIRS] = off + size
    for i in range(2 * off, 2 * (off + size)):
        edges[i] = -1
    if cls > MAX_LINEAR_CLASS:
        edges[2 * off] = 0  # header: degree
    return (cls << OFFSET_BITS) | off


@njit(cache=True)
def _free_block(edges, m, block):
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    edges[2 * off] = m[M_FREE + cls]
    m[M_FREE + cls] = off


@njit(cache=True, inline="always")
def get_edge(states, edges, s, token):
    """Target of the edge s --token-->, or -1."""
    b = s * STATE_WIDTH
    first = states[b + S_TOKEN]
    if first == token:
        return states[b + S_TARGET]
    if first == NO_EDGE:
        return -1
    return _get_block_edge(edges, states[b + S_BLOCK], token)


@njit(cache=True, inline="always")
def _find_slot(edges, block, token):
    """Pair index in a block holding `token`, else the slot it would go in; -1 when a linear block
    is full without it (a hash block always has a free slot: its load stays <= 1/2)."""
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    if cls <= MAX_LINEAR_CLASS:
        for i in range(off, off + (1 << cls)):
            t = edges[2 * i]
            if t == token or t < 0:
                return i
        return -1
    mask = (1 << cls) - 1
    base = off + 1
    i = _hash_slot(token, mask)
    while True:
        t = edges[2 * (base + i)]
        if t == token or t < 0:
            return base + i
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _get_block_edge(edges, block, token):
    """Target of `token` in an edge block, or -1."""
    if block == NO_BLOCK:
        return -1
    i = _find_slot(edges, block, token)
    return edges[2 * i + 1] if i >= 0 and edges[2 * i] == token else -1


@njit(cache=True, inline="always")
def _block_put(edges, block, token, target):
    """Set token -> target in a block. Returns the degree after (for a linear block, the filled
    prefix up to this edge), or -1 if a linear block is full."""
    i = _find_slot(edges, block, token)
    if i < 0:
        return -1
    new = edges[2 * i] < 0
    edges[2 * i] = token
    edges[2 * i + 1] = target
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    if cls <= MAX_LINEAR_CLASS:
        return i - off + 1
    if new:
        edges[2 * off] += 1
    return edges[2 * off]


@njit(cache=True)
def _class_for_degree(degree):
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
def _move_edges(edges, src_block, dst_block):
    """Copy every edge of src_block into dst_block; returns how many."""
    cls = src_block >> OFFSET_BITS
    off = src_block & OFFSET_MASK
    n = 0
    if cls <= MAX_LINEAR_CLASS:
        for i in range(off, off + (1 << cls)):
            if edges[2 * i] < 0:
                break
            _block_put(edges, dst_block, edges[2 * i], edges[2 * i + 1])
            n += 1
    else:
        for i in range(off + 1, off + 1 + (1 << cls)):
            if edges[2 * i] >= 0:
                _block_put(edges, dst_block, edges[2 * i], edges[2 * i + 1])
                n += 1
    return n


@njit(cache=True)
def _block_degree(edges, block):
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    if cls > MAX_LINEAR_CLASS:
        return edges[2 * off]
    n = 0
    while n < (1 << cls) and edges[2 * (off + n)] >= 0:
        n += 1
    return n


@njit(cache=True)
def _pairs_for_new_edge(states, edges, s):
    """Pairs the allocator hands out when state s gains one edge."""
    if states[s * STATE_WIDTH + S_TOKEN] == NO_EDGE:
        return 0  # it goes inline
    block = states[s * STATE_WIDTH + S_BLOCK]
    if block == NO_BLOCK:
        return _class_pairs(0)
    cls = block >> OFFSET_BITS
    degree = _block_degree(edges, block) + 1
    fits = degree <= (1 << cls) if cls <= MAX_LINEAR_CLASS else 2 * degree <= (1 << cls)
    return 0 if fits else _class_pairs(_class_for_degree(degree))


@njit(cache=True)
def pairs_needed(states, edges, last, token):
    """Upper bound on the edge pairs that extending `last` by `token` allocates: one new edge per
    state on the suffix-link path that lacks `token`, and a copy of the block of a state split."""
    need = 0
    p = last
    while p != -1:
        q = get_edge(states, edges, p, token)
        if q >= 0:
            qb = states[q * STATE_WIDTH + S_BLOCK]
            if states[p * STATE_WIDTH + S_LEN] + 1 != states[q * STATE_WIDTH + S_LEN]:
                # The clone copies q's block, which may have grown (or appeared) if q was on the path.
                now = _class_pairs(qb >> OFFSET_BITS) if qb != NO_BLOCK else 0
                need += max(now, _pairs_for_new_edge(states, edges, q))
            return need
        need += _pairs_for_new_edge(states, edges, p)
        p = states[p * STATE_WIDTH + S_LINK]
    return need


@njit(cache=True)
def set_edge(states, edges, m, s, token, target):
    """Add or redirect the edge s --token--> target: inline if it is the state's first edge, else in
    its block, moved to a bigger block when full (room reserved by the caller)."""
    b = s * STATE_WIDTH
    first = states[b + S_TOKEN]
    if first == NO_EDGE or first == token:  # noqa: SIM109 (numba: plain comparisons)
        states[b + S_TOKEN] = token
        states[b + S_TARGET] = target
        return
    block = states[s * STATE_WIDTH + S_BLOCK]
    if block == NO_BLOCK:
        block = _alloc_block(edges, m, 0)
        states[s * STATE_WIDTH + S_BLOCK] = block
    cls = block >> OFFSET_BITS
    degree = _block_put(edges, block, token, target)
    if degree >= 0 and (cls <= MAX_LINEAR_CLASS or 2 * degree <= (1 << cls)):
        return
    # Full linear block (put refused) or hash block now over half full: move to the next class.
    count = degree if degree >= 0 else (1 << cls) + 1
    bigger = _alloc_block(edges, m, _class_for_degree(count))
    _move_edges(edges, block, bigger)
    if degree < 0:
        _block_put(edges, bigger, token, target)
    _free_block(edges, m, block)
    states[s * STATE_WIDTH + S_BLOCK] = bigger


@njit(cache=True)
def _hash_delete(edges, block, token):
    """Remove `token` (present) from a hash block; later entries of its probe run shift back."""
    cls = block >> OFFSET_BITS
    off = block & OFFSET_MASK
    mask = (1 << cls) - 1
    base = off + 1
    i = _find_slot(edges, block, token) - base
    j = i
    while True:
        j = (j + 1) & mask
        t = edges[2 * (base + j)]
        if t < 0:
            break
        home = _hash_slot(t, mask)
        # The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            edges[2 * (base + i)] = t
            edges[2 * (base + i) + 1] = edges[2 * (base + j) + 1]
            i = j
    edges[2 * (base + i)] = -1
    edges[2 * (base + i) + 1] = -1
    edges[2 * off] -= 1


@njit(cache=True)
def _promote(states, edges, s, token):
    """Make the edge s --token--> (held in s's block) the inline one; the inline edge moves to the
    block. Allocates nothing."""
    b = s * STATE_WIDTH
    block = states[b + S_BLOCK]
    i = _find_slot(edges, block, token)
    target = edges[2 * i + 1]
    old_token, old_target = states[b + S_TOKEN], states[b + S_TARGET]
    if (block >> OFFSET_BITS) <= MAX_LINEAR_CLASS:
        edges[2 * i] = old_token
        edges[2 * i + 1] = old_target
    else:
        _hash_delete(edges, block, token)
        _block_put(edges, block, old_token, old_target)
    states[b + S_TOKEN] = token
    states[b + S_TARGET] = target


# ============================================================================ states ===========
@njit(cache=True, inline="always")
def _new_state(states, m, length, link, rep):
    """Append a state (room reserved by the caller: at most two per token). Returns its index."""
    n = m[M_STATES]
    b = n * STATE_WIDTH
    states[b + S_LEN] = length
    states[b + S_LINK] = link
    states[b + S_REP] = rep
    states[b + S_TOKEN] = NO_EDGE
    states[b + S_TARGET] = -1
    states[b + S_BLOCK] = NO_BLOCK
    states[b + S_COUNT] = 0
    m[M_STATES] = n + 1
    return n


@njit(cache=True)
def _split(states, edges, m, p, token, q, length):
    """Clone q with the given length, point p's suffix-link path at the clone, link q to it.
    Returns the clone."""
    c = _new_state(states, m, length, states[q * STATE_WIDTH + S_LINK], states[q * STATE_WIDTH + S_REP])
    states[c * STATE_WIDTH + S_TOKEN] = states[q * STATE_WIDTH + S_TOKEN]
    states[c * STATE_WIDTH + S_TARGET] = states[q * STATE_WIDTH + S_TARGET]
    states[c * STATE_WIDTH + S_COUNT] = states[q * STATE_WIDTH + S_COUNT]
    block = states[q * STATE_WIDTH + S_BLOCK]
    if block != NO_BLOCK:
        copy = _alloc_block(edges, m, block >> OFFSET_BITS)
        _move_edges(edges, block, copy)
        states[c * STATE_WIDTH + S_BLOCK] = copy
    while p != -1 and get_edge(states, edges, p, token) == q:
        set_edge(states, edges, m, p, token, c)
        p = states[p * STATE_WIDTH + S_LINK]
    states[q * STATE_WIDTH + S_LINK] = c
    return c


@njit(cache=True)
def extend_state(states, edges, m, last, token, pos):
    """Generalised online SAM extension of the text ending in `last` by `token` at log `pos`.

    Returns the state of the extended text. Amortised O(1) per token; room for two states and
    `pairs_needed` edge pairs is reserved by the caller.
    """
    last_len = states[last * STATE_WIDTH + S_LEN]
    q = get_edge(states, edges, last, token)
    if q >= 0:  # the extended text already occurs (another member wrote it): reuse or split
        if states[q * STATE_WIDTH + S_LEN] == last_len + 1:
            return q
        return _split(states, edges, m, last, token, q, last_len + 1)
    cur = _new_state(states, m, last_len + 1, 0, pos)
    p = last
    while p != -1:
        q = get_edge(states, edges, p, token)
        if q >= 0:
            break
        set_edge(states, edges, m, p, token, cur)
        p = states[p * STATE_WIDTH + S_LINK]
    if p != -1:
        p_len = states[p * STATE_WIDTH + S_LEN]
        if p_len + 1 == states[q * STATE_WIDTH + S_LEN]:
            states[cur * STATE_WIDTH + S_LINK] = q
        else:
            states[cur * STATE_WIDTH + S_LINK] = _split(states, edges, m, p, token, q, p_len + 1)
    return cur


@njit(cache=True, inline="always")
def _normalise(states, v, length):
    """The state that holds the suffix of `length` ending in state v's class, after later splits."""
    while v > 0 and length <= states[states[v * STATE_WIDTH + S_LINK] * STATE_WIDTH + S_LEN]:
        v = states[v * STATE_WIDTH + S_LINK]
    return v


@njit(cache=True, inline="always")
def min_length(states, v):
    """Length of the shortest string of state v (v > 0)."""
    return states[states[v * STATE_WIDTH + S_LINK] * STATE_WIDTH + S_LEN] + 1


@njit(cache=True)
def count_occurrence(states, edges, member, token, depth, recency_percent):
    """After `token` was appended to a member (its state already extended): one more occurrence
    for every state holding a suffix of at most `depth` tokens, and, for the states of the previous
    suffixes that hold one of at most depth - 1, the kept (inline) continuation updated: `token`
    takes its place once its count times `recency_percent` / 100 reaches the kept one's (100: the
    most frequent, ties going to the most recent; higher values favour recent text).

    At most 2 depth states are visited; nothing is allocated."""
    before = member[MB_BOUND_LEN]
    b = _normalise(states, member[MB_BOUND], before)
    v = get_edge(states, edges, b, token)
    after = before + 1
    if after > depth:
        after = depth
        v = _normalise(states, v, after)
    member[MB_BOUND] = v
    member[MB_BOUND_LEN] = after
    # x runs over the previous suffixes' states, w over the new ones (each counted once, on arrival):
    # w = x --token--> when w holds x's shortest string followed by the token.
    w = v
    states[w * STATE_WIDTH + S_COUNT] += 1
    x = b
    while x > 0:
        xb = x * STATE_WIDTH
        shortest = min_length(states, x)
        if shortest < depth and states[xb + S_TOKEN] != token:
            while states[states[w * STATE_WIDTH + S_LINK] * STATE_WIDTH + S_LEN] > shortest:
                w = states[w * STATE_WIDTH + S_LINK]
                states[w * STATE_WIDTH + S_COUNT] += 1
            kept = states[states[xb + S_TARGET] * STATE_WIDTH + S_COUNT]
            if recency_percent * states[w * STATE_WIDTH + S_COUNT] >= 100 * kept:
                _promote(states, edges, x, token)
        x = states[xb + S_LINK]
    w = states[w * STATE_WIDTH + S_LINK]
    while w > 0:
        states[w * STATE_WIDTH + S_COUNT] += 1
        w = states[w * STATE_WIDTH + S_LINK]


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


@njit(cache=True, inline="always")
def _new_chunk(m):
    """Offset of a fresh chunk (room reserved by the caller)."""
    off = m[M_LOG]
    m[M_LOG] = off + CHUNK
    return off


@njit(cache=True, inline="always")
def write_token(log, m, pos, token):
    """Write `token` after log position `pos` (-1: a fresh start). Returns its position.

    The slot after `pos` is taken when another member already continued from there; then the
    writer starts a chunk of its own, linked from nowhere (its earlier text lives in the shared part).
    """
    nxt = -1
    if pos >= 0:
        nxt = pos + 1
        if nxt % CHUNK == CHUNK - 1:  # end of chunk: follow or create the link
            link = log[nxt]
            if link < 0:
                link = _new_chunk(m)
                log[nxt] = link
            nxt = link
        if log[nxt] >= 0:
            nxt = -1
    if nxt < 0:
        nxt = _new_chunk(m)
    log[nxt] = token
    m[M_TOKENS] += 1
    return nxt


@njit(cache=True, inline="always")
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


@njit(cache=True)
def read_tokens(log, pos, count, out):
    """out[:count] = the member's tokens from log position pos on."""
    for i in range(count):
        out[i] = log[pos]
        pos = follower(log, pos)


# ============================================================================ requests =========
@njit(cache=True, inline="always")
def _track(states, edges, cursor, r, field, token):
    """Advance a request's match in a (read-only) history automaton by one token."""
    v = cursor[r, field]
    length = cursor[r, field + 1]
    while True:
        nxt = get_edge(states, edges, v, token)
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
def _append_in_place(states, edges, log, m, member, tokens, start, stop, depth):
    """Append tokens[start:stop] to one member while the edge pool has room.

    Returns (tokens done up to, first log position written or -1)."""
    free = edges.size // 2 - m[M_PAIRS]
    first = -1
    state, pos = member[MB_STATE], member[MB_POS]
    done = stop
    for j in range(start, stop):
        token = tokens[j]
        if pairs_needed(states, edges, state, token) > free:
            done = j
            break
        pos = write_token(log, m, pos, token)
        if first < 0:
            first = pos
        state = extend_state(states, edges, m, state, token, pos)
        if depth > 0:
            count_occurrence(states, edges, member, token, depth, m[M_RECENCY])
        free = edges.size // 2 - m[M_PAIRS]
    member[MB_STATE], member[MB_POS] = state, pos
    return done, first


RUN = 1024  # tokens per reservation: the worst case (two states a token) is reserved a run at a time


@njit(cache=True)
def append_run(table, meta, a, member, tokens, start, stop, need, depth):
    """Append tokens[start:stop] to one member of automaton a (its cursor `member` is updated) while
    its arrays have room; with `depth` > 0, occurrence counts to that depth follow.

    Returns (tokens done up to, first log position written or -1); stopping short of `stop` means
    `need` says what to grow."""
    m = meta[a]
    states, edges, log = view(table, a, T_STATES), view(table, a, T_EDGES), view(table, a, T_LOG)
    first = -1
    j = start
    while j < stop:
        run_stop = min(j + RUN, stop)
        states_need = (m[M_STATES] + 2 * (run_stop - j)) * STATE_WIDTH
        log_need = m[M_LOG] + _log_room(run_stop - j)
        if states_need > states.size or log_need > log.size:
            _ask(need, a, states_need, 0, log_need)
            return j, first
        j, first_here = _append_in_place(states, edges, log, m, member, tokens, j, run_stop, depth)
        if first < 0:
            first = first_here
        if 2 * m[M_PAIRS] > edges.size or m[M_STATES] * STATE_WIDTH > states.size or m[M_LOG] > log.size:
            raise RuntimeError("suffix automaton overran its reserved room (a bug in pairs_needed)")
        if j < run_stop:
            _ask(need, a, 0, 2 * (m[M_PAIRS] + pairs_needed(states, edges, member[MB_STATE], tokens[j])), 0)
            return j, first
    return j, first


@njit(cache=True)
def history_views(table, history):
    """(states, edges, log) of each history generation, once per batch; empty where absent."""
    empty = np.empty(0, dtype=np.int32)
    h0, h1 = history[0], history[1]
    return (
        (view(table, h0, T_STATES), view(table, h0, T_EDGES), view(table, h0, T_LOG))
        if h0 >= 0
        else (empty, empty, empty),
        (view(table, h1, T_STATES), view(table, h1, T_EDGES), view(table, h1, T_LOG))
        if h1 >= 0
        else (empty, empty, empty),
    )


@njit(cache=True)
def _track_run(hs, he, cursor, r, field, tokens, start, stop):
    if hs.size == 0:
        return
    cursor[r, field] = _normalise(hs, cursor[r, field], cursor[r, field + 1])
    for j in range(start, stop):
        _track(hs, he, cursor, r, field, tokens[j])


@njit(cache=True)
def score_guesses(m, row, token):
    """Adaptive: where the last draft's two candidates disagreed on its first token, the one that
    equals the emitted `token` wins (decayed counts in the group automaton's meta `m`)."""
    first, frequent = row[R_GUESS + 1], row[R_GUESS + 2]
    row[R_GUESS] = -1
    if first == frequent:
        return
    m[M_WINS] -= m[M_WINS] >> WIN_SHIFT
    m[M_WINS + 1] -= m[M_WINS + 1] >> WIN_SHIFT
    if token == first:
        m[M_WINS] += WIN_UNIT
    elif token == frequent:
        m[M_WINS + 1] += WIN_UNIT


@njit(cache=True)
def append_tokens(table, meta, cursor, hist, r, tokens, start, stop, need, depth):
    """Append tokens[start:stop] to request r (its group automaton and its history matches).
    Returns the tokens done up to; short of `stop` means grow as `need` says."""
    if stop <= start:
        return stop
    if cursor[r, R_GUESS] == cursor[r, R_TOKENS]:
        score_guesses(meta[cursor[r, R_AUTO]], cursor[r], tokens[start])
    member = cursor[r, R_MEMBER : R_MEMBER + MEMBER_WIDTH]
    j, first = append_run(table, meta, cursor[r, R_AUTO], member, tokens, start, stop, need, depth)
    if cursor[r, R_FIRST] < 0:
        cursor[r, R_FIRST] = first
    cursor[r, R_TOKENS] += j - start
    _track_run(hist[0][0], hist[0][1], cursor, r, R_HIST, tokens, start, j)
    _track_run(hist[1][0], hist[1][1], cursor, r, R_HIST + 2, tokens, start, j)
    store = cursor[r, R_STORE_AUTO]
    if store >= 0:
        _track_run(view(table, store, T_STATES), view(table, store, T_EDGES), cursor, r, R_STORE, tokens, start, j)
    return j


@njit(cache=True)
def first_invalid(tokens, start, stop):
    for j in range(start, stop):
        if tokens[j] < 0:
            return j
    return -1


@njit(cache=True)
def first_bad_row(cursor, slots, rows, row_lengths):
    """Batch index of the first row shorter than what its request has seen, longer than the array,
    or holding a negative id; -1 if every row is good."""
    for i in range(slots.size):
        seen = cursor[slots[i], R_TOKENS]
        if row_lengths[i] < seen or row_lengths[i] > rows.shape[1] or first_invalid(rows[i], seen, row_lengths[i]) >= 0:
            return i
    return -1


@njit(cache=True)
def sync_rows(table, meta, cursor, history, slots, rows, row_lengths, need, depth):
    """Append rows[i, seen:row_lengths[i]] to request slots[i], for the whole batch.

    Returns OK; GROW (call again after growing: it resumes); or the index of the first bad row
    (see first_bad_row), having appended nothing."""
    bad = first_bad_row(cursor, slots, rows, row_lengths)
    if bad >= 0:
        return bad
    hist = history_views(table, history)
    for i in range(slots.size):
        r = slots[i]
        done = append_tokens(table, meta, cursor, hist, r, rows[i], cursor[r, R_TOKENS], row_lengths[i], need, depth)
        if done < row_lengths[i]:
            return GROW
    return OK


@njit(cache=True)
def extend_flat(table, meta, cursor, history, slots, tokens, offsets, progress, need, depth):
    """Append tokens[offsets[i]:offsets[i+1]] to request slots[i] (validated by the caller).
    progress[i] counts what is done, so a call after GROW resumes. Returns OK or GROW."""
    hist = history_views(table, history)
    for i in range(slots.size):
        stop = offsets[i + 1]
        done = append_tokens(table, meta, cursor, hist, slots[i], tokens, offsets[i] + progress[i], stop, need, depth)
        progress[i] = done - offsets[i]
        if done < stop:
            return GROW
    return OK


@njit(cache=True)
def insert_text(table, meta, a, tokens, start, member, need, depth):
    """Insert tokens[start:] as a member of automaton a whose cursor is `member` (a fresh one for a
    group's prompt or a finished response). Returns the tokens done up to."""
    j, _ = append_run(table, meta, a, member, tokens, start, tokens.size, need, depth)
    return j


@njit(cache=True)
def track_history(table, cursor, history, r, tokens):
    """Advance request r's history matches over tokens it already holds (its prompt)."""
    hist = history_views(table, history)
    _track_run(hist[0][0], hist[0][1], cursor, r, R_HIST, tokens, 0, tokens.size)
    _track_run(hist[1][0], hist[1][1], cursor, r, R_HIST + 2, tokens, 0, tokens.size)


# ============================================================================ drafting =========
# Policy: one float64 array, built once per configuration.
P_MIN_MATCH = 0  # no draft below this match length
P_SCALED = 1  # 1: one token per matched token beyond min_match - 1, capped at k
P_FREQUENT = 2  # 1: score matches up to P_LONG_MATCH tokens by counts (else: first occurrence only)
P_MIN_PROB = 3  # frequent: stop a draft when its estimated probability falls below this
P_PRIOR = 4  # frequent: pseudo-occurrences added to every context count (shrinks rare contexts)
P_LONG_MATCH = 5  # frequent: matches longer than this follow their first occurrence
P_COUNT_DEPTH = 6  # frequent: count_depth(long_match); 0: no counts are kept
P_ADAPTIVE = 7  # 1: per group, draft from the first occurrence or the frequent continuation (see _adaptive)
P_MATCH = 8  # 1: base_k tokens, or floor(match_scale * match) where that is more, capped at k
P_BASE_K = 9  # match: tokens any match drafts; a counted draft's further tokens need P_MIN_PROB
P_MATCH_SCALE = 10  # match: draft tokens per matched token
POLICY_WIDTH = 11

# adaptive: each disagreement decays both wins by 1/2**WIN_SHIFT (a memory of ~128 disagreements);
# the first occurrence is drafted while its wins exceed the frequent one's by FIRST_LEAD_PERCENT
WIN_SHIFT = 7
WIN_UNIT = 1 << 16
FIRST_LEAD_PERCENT = 110

# Sources, in the order they win ties: the group automaton, the group's stored responses (prompt store),
# then the history generations (newest first).
NUM_SOURCES = 2 + NUM_HISTORY
W_AUTO = 0  # work[W_AUTO + i]: source i's automaton, -1 if absent
W_STATE = NUM_SOURCES  # its state of the matched suffix
W_LEN = 2 * NUM_SOURCES  # its match length (0: no match, or left out)
W_PATH = 3 * NUM_SOURCES  # a draft path's current state in it (-1: off the path)
WORK_WIDTH = 4 * NUM_SOURCES


@njit(cache=True)
def _best_in(states, log, v, length, k, longer_than):
    """Walk from (v, length) towards the root, while the match is longer than `longer_than`, until a
    first occurrence has a follower. Returns (match length, position, available tokens)."""
    while v > 0 and length > longer_than:
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
def length_cap(match, k, policy):
    """The most tokens a draft from a match of this length may take under the policy (draft_length,
    or with P_MATCH: base_k, or floor(match_scale * match) where that is more, capped at k)."""
    min_match = int(policy[P_MIN_MATCH])
    if policy[P_MATCH] <= 0:
        return draft_length(match, k, min_match, policy[P_SCALED] > 0)
    if match < min_match or match == 0:
        return 0
    n = max(int(policy[P_BASE_K]), int(np.floor(policy[P_MATCH_SCALE] * match)))
    return n if n < k else k


@njit(cache=True, inline="always")
def gated_from(policy):
    """The first draft token that the confidence threshold gates: 0, or base_k under P_MATCH."""
    return int(policy[P_BASE_K]) if policy[P_MATCH] > 0 else 0


@njit(cache=True, inline="always")
def _source_kind(i):
    """What a proposal reports for source i."""
    if i == 0:
        return SOURCE_GROUP
    return SOURCE_STORE if i == 1 else SOURCE_HISTORY


@njit(cache=True)
def _matches(table, cursor, history, r, group_only, work):
    """Each source's automaton and matched suffix (state, length) for request r into `work`; with
    `group_only` the other sources get length 0."""
    a = cursor[r, R_AUTO]
    v = cursor[r, R_MEMBER + MB_STATE]
    work[W_AUTO] = a
    work[W_STATE] = v
    work[W_LEN] = view(table, a, T_STATES)[v * STATE_WIDTH + S_LEN]
    work[W_AUTO + 1] = cursor[r, R_STORE_AUTO]
    for g in range(NUM_HISTORY):
        work[W_AUTO + 2 + g] = history[g]
    for i in range(1, NUM_SOURCES):
        a = work[W_AUTO + i]
        field = R_STORE if i == 1 else R_HIST + 2 * (i - 2)
        if not group_only and a >= 0:
            work[W_STATE + i] = _normalise(view(table, a, T_STATES), cursor[r, field], cursor[r, field + 1])
            work[W_LEN + i] = cursor[r, field + 1]
        else:
            work[W_STATE + i] = 0
            work[W_LEN + i] = 0


@njit(cache=True)
def _first_occurrence(table, work, k, longer_than):
    """The longest match longer than `longer_than` whose first occurrence has a follower, over all
    sources (ties: the order of the sources). Returns (match, source, position, available)."""
    best, best_src, best_pos, best_n = 0, -1, -1, 0
    for i in range(NUM_SOURCES):
        if work[W_LEN + i] == 0:
            continue
        a = work[W_AUTO + i]
        match, pos, n = _best_in(
            view(table, a, T_STATES), view(table, a, T_LOG), work[W_STATE + i], work[W_LEN + i], k, longer_than
        )
        if match > best:
            best, best_src, best_pos, best_n = match, i, pos, n
    return best, best_src, best_pos, best_n


@njit(cache=True, inline="always")
def _count(states, v):
    return states[v * STATE_WIDTH + S_COUNT]


@njit(cache=True)
def _pooled_count(table, work, token):
    """Occurrences of the path's string followed by `token`, summed over the sources on the path;
    and the source holding most of them."""
    pooled, top, top_source = 0, 0, -1
    for j in range(NUM_SOURCES):
        u = work[W_PATH + j]
        if u > 0:
            a = work[W_AUTO + j]
            states = view(table, a, T_STATES)
            nxt = get_edge(states, view(table, a, T_EDGES), u, token)
            if nxt >= 0:
                c = _count(states, nxt)
                pooled += c
                if c > top:
                    top, top_source = c, j
    return pooled, top_source


@njit(cache=True)
def _frequent_path(table, work, length, deep, cap, min_prob, gated, prior, beat, out):
    """From the states work[W_PATH + i] (one matched string of `length` tokens in each source),
    follow the most frequent continuation over the sources' pooled counts, at most `cap` tokens,
    while the estimated probability of the whole draft stays >= min_prob (checked from token `gated`
    on: the tokens before it are drafted whatever their probability). A source drops out where
    the path leaves it or leaves its scored states (those holding a string of at most `deep`
    tokens). Candidates are the sources' own most frequent continuations (their inline edges).

    Returns (tokens, expected accepted tokens, source of the first token). A path that cannot score
    above `beat` stops early (each later token adds at most the current probability)."""
    p = 1.0
    score = 0.0
    n = 0
    first_source = -1
    while n < cap:
        total = prior
        for i in range(NUM_SOURCES):
            u = work[W_PATH + i]
            if u > 0:
                states = view(table, work[W_AUTO + i], T_STATES)
                if length + n > deep and min_length(states, u) > deep:
                    work[W_PATH + i] = -1
                else:
                    total += _count(states, u)
        best_token, best_count, best_source = -1, 0, -1
        for i in range(NUM_SOURCES):
            u = work[W_PATH + i]
            if u <= 0:
                continue
            token = view(table, work[W_AUTO + i], T_STATES)[u * STATE_WIDTH + S_TOKEN]
            if token < 0:
                continue
            pooled, source = _pooled_count(table, work, token)
            if pooled > best_count:
                best_token, best_count, best_source = token, pooled, source
        if best_token < 0:
            break
        p *= min(1.0, best_count / total)
        if (p < min_prob and n >= gated) or score + p * (cap - n) <= beat:
            break
        out[n] = best_token
        n += 1
        score += p
        if first_source < 0:
            first_source = best_source
        for i in range(NUM_SOURCES):
            u = work[W_PATH + i]
            if u > 0:
                a = work[W_AUTO + i]
                work[W_PATH + i] = get_edge(view(table, a, T_STATES), view(table, a, T_EDGES), u, best_token)
    return n, score, first_source


@njit(cache=True)
def _frequent(table, work, k, policy, scratch, out_row, best_score):
    """Score a draft for every matched length from min(long_match, longest match) down to min_match
    (once per run of lengths whose states agree in every source) and keep the best expected number
    of accepted tokens above `best_score` (ties: the longer match) in out_row.

    Returns (tokens, match length, source, score); no tokens if nothing beat best_score."""
    min_match = max(int(policy[P_MIN_MATCH]), 1)
    deep = int(policy[P_COUNT_DEPTH]) - 1
    m = 0
    for i in range(NUM_SOURCES):
        m = max(m, work[W_LEN + i])
    m = min(m, int(policy[P_LONG_MATCH]))
    best_n, best_match, best_source = 0, 0, -1
    while m >= min_match:
        for i in range(NUM_SOURCES):
            if work[W_LEN + i] >= m:
                work[W_STATE + i] = _normalise(view(table, work[W_AUTO + i], T_STATES), work[W_STATE + i], m)
                work[W_PATH + i] = work[W_STATE + i]
            else:
                work[W_PATH + i] = -1
        cap = length_cap(m, k, policy)
        n, score, source = _frequent_path(
            table, work, m, deep, cap, policy[P_MIN_PROB], gated_from(policy), policy[P_PRIOR], best_score, scratch
        )
        if n > 0 and score > best_score:
            best_n, best_match, best_source, best_score = n, m, source, score
            out_row[:n] = scratch[:n]
        below = 0  # the next length at which some source's state changes or a source starts matching
        for i in range(NUM_SOURCES):
            length = work[W_LEN + i]
            if length >= m:
                below = max(below, min_length(view(table, work[W_AUTO + i], T_STATES), work[W_STATE + i]) - 1)
            else:
                below = max(below, length)
        m = below
    return best_n, best_match, best_source, best_score


@njit(cache=True)
def _propose_one(table, meta, cursor, history, r, k, policy, work, scratch, out_row):
    """Draft for request r into out_row. Returns (tokens drafted, match length, source).

    First occurrence: the longest match among the sources wins (ties: the order of the sources).
    Frequent: the same for matches longer than long_match; below that, the best-scored draft over
    counts pooled across all sources, or over the group automaton alone (its own statistics: a
    request's loops, its siblings' phrasing). Adaptive: see _adaptive."""
    frequent = policy[P_FREQUENT] > 0
    adaptive = policy[P_ADAPTIVE] > 0
    long_match = int(policy[P_LONG_MATCH])
    _matches(table, cursor, history, r, False, work)
    match, src, pos, n = _first_occurrence(table, work, k, 0 if adaptive else (long_match if frequent else 0))
    if match > 0 and (not adaptive or match > long_match):
        return _copy_first(table, work, k, policy, match, src, pos, n, out_row)
    if not frequent:
        return 0, 0, SOURCE_NONE
    if adaptive:
        return _adaptive(table, meta, cursor, history, r, k, policy, work, scratch, out_row, match, src, pos, n)
    return _frequent_draft(table, cursor, history, r, k, policy, work, scratch, out_row)


@njit(cache=True, inline="always")
def _first_count(match, n, k, policy):
    """Tokens drafted from a first occurrence with n tokens after it."""
    return min(length_cap(match, k, policy), n)


@njit(cache=True)
def _copy_first(table, work, k, policy, match, src, pos, n, out_row):
    """The first occurrence's continuation of a match in source src."""
    count = _first_count(match, n, k, policy)
    if count <= 0:
        return 0, match, SOURCE_NONE
    copy_continuation(view(table, work[W_AUTO + src], T_LOG), pos, count, out_row)
    return count, match, _source_kind(src)


@njit(cache=True)
def _adaptive(table, meta, cursor, history, r, k, policy, work, scratch, out_row, match, src, pos, n):
    """A match of at most long_match tokens: both candidates are drafted, their first tokens kept in
    the request's cursor (score_guesses scores them against the next emitted token), and the first
    occurrence is sent while the group's wins for it lead the frequent one's by FIRST_LEAD_PERCENT.
    Math traces (near-deterministic text) favour the first occurrence, T=1.0 text the counts."""
    first_token = -1
    if match > 0 and _first_count(match, n, k, policy) > 0:
        log = view(table, work[W_AUTO + src], T_LOG)
        first_token = log[follower(log, pos)]
    count, f_match, f_src = _frequent_draft(table, cursor, history, r, k, policy, work, scratch, out_row)
    row = cursor[r]
    row[R_GUESS] = row[R_TOKENS]
    row[R_GUESS + 1] = first_token
    row[R_GUESS + 2] = out_row[0] if count > 0 else -1
    m = meta[cursor[r, R_AUTO]]
    if 100 * m[M_WINS] > FIRST_LEAD_PERCENT * m[M_WINS + 1] and first_token >= 0:
        return _copy_first(table, work, k, policy, match, src, pos, n, out_row)
    return count, f_match, f_src


@njit(cache=True)
def _frequent_draft(table, cursor, history, r, k, policy, work, scratch, out_row):
    """The best-scored draft over pooled counts, or over the group automaton alone."""
    count, match, src, score = _frequent(table, work, k, policy, scratch, out_row, 0.0)
    if work[W_AUTO + 1] >= 0 or work[W_AUTO + 2] >= 0:  # the group alone (_frequent moved the matches)
        _matches(table, cursor, history, r, True, work)
        alone, alone_match, alone_src, _ = _frequent(table, work, k, policy, scratch, out_row, score)
        if alone > 0:
            count, match, src = alone, alone_match, alone_src
    if count <= 0:
        return 0, match, SOURCE_NONE
    return count, match, _source_kind(src)


@njit(cache=True)
def propose_batch(table, meta, cursor, history, slots, k, policy, work, scratch, out, out_len, out_match, out_source):
    """Drafts for requests slots[i] into out[i, :out_len[i]]."""
    for i in range(slots.size):
        out_len[i], out_match[i], out_source[i] = _propose_one(
            table, meta, cursor, history, slots[i], k, policy, work, scratch, out[i]
        )


@njit(cache=True)
def step_rows(
    table,
    meta,
    cursor,
    history,
    slots,
    rows,
    row_lengths,
    need,
    k,
    policy,
    work,
    scratch,
    out,
    out_len,
    out_match,
    out_source,
):
    """sync_rows then propose_batch in one call. Every request is synced before any proposes, so a
    sibling's tokens of this step count whatever the row order. Returns sync_rows' answer."""
    code = sync_rows(table, meta, cursor, history, slots, rows, row_lengths, need, int(policy[P_COUNT_DEPTH]))
    if code == OK and k > 0:
        propose_batch(
            table, meta, cursor, history, slots, k, policy, work, scratch, out, out_len, out_match, out_source
        )
    return code
