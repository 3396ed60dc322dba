"""Building the automata: appending tokens to a member (states, clones, suffix links, counts, log).

`extend_state` is the generalised online suffix-automaton extension over the flat arrays of `layout`;
`append_run` appends a run of tokens to one member, reserving room first (GROW when there is none);
`sync_rows` / `extend_flat` / `insert_text` append for a batch of requests, a prompt or a finished response.

Counts are kept only where they are cheap: for states holding a string of at most `depth` tokens
(`count_depth(long_match)`, a setting of the drafter, fixed for its automata). Each member (a request's
text, a prompt, a finished response) keeps a cursor on the state of its last min(depth, length)
tokens; an append walks from there to the root adding one occurrence, then walks the previous
cursor's path to keep each state's inline edge on its most frequent continuation, or on a recent one
whose count comes close (`count_occurrence`). That bounds the work per token by 2 * depth states (at
most 42), whatever the context length.

The adaptive policy keeps, per request, the first tokens of its last draft's two candidates (first
occurrence, frequent; `R_GUESS`); the next append scores them (`score_guesses`) into decayed wins in
the group automaton's meta (`M_WINS`), which decide the next drafts (`draft._adaptive`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .edges import _promote, copy_block, get_edge, pairs_needed, set_edge
from .layout import (
    CHUNK,
    GROW,
    M_LOG,
    M_PAIRS,
    M_RECENCY,
    M_STATES,
    M_WINS,
    MB_BOUND,
    MB_BOUND_LEN,
    MB_POS,
    MB_STATE,
    MEMBER_WIDTH,
    NO_BLOCK,
    NO_EDGE,
    OK,
    R_AUTO,
    R_FIRST,
    R_GUESS,
    R_HIST,
    R_MEMBER,
    R_STORE,
    R_STORE_AUTO,
    R_TOKENS,
    S_BLOCK,
    S_COUNT,
    S_LEN,
    S_LINK,
    S_REP,
    S_TARGET,
    S_TOKEN,
    STATE_WIDTH,
    T_EDGES,
    T_LOG,
    T_STATES,
    WIN_SHIFT,
    WIN_UNIT,
    view,
)
from .token_log import write_token


@njit(cache=True, inline="always")
def _ask(need, a, states, edges, log):
    need[0], need[1], need[2], need[3] = a, states, edges, log
    return GROW


@njit(cache=True, inline="always")
def _log_room(tokens):
    """Log slots one member may take for `tokens` more tokens: a chunk per CHUNK - 1 tokens, a fresh
    chunk when it cannot continue in place, and a link chunk."""
    return (tokens // (CHUNK - 1) + 2) * CHUNK


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
        states[c * STATE_WIDTH + S_BLOCK] = copy_block(edges, m, block)
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
def normalise(states, v, length):
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
    b = normalise(states, member[MB_BOUND], before)
    v = get_edge(states, edges, b, token)
    after = before + 1
    if after > depth:
        after = depth
        v = normalise(states, v, after)
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
    cursor[r, field] = normalise(hs, cursor[r, field], cursor[r, field + 1])
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


@njit(cache=True, nogil=True)  # releases the GIL: the async route drafts in a thread
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
