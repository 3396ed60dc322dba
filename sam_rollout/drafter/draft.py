"""Drafting: per request, a continuation of its longest suffix match among its sources.

Policies (`policy`, a float64 array of P_* fields):
first occurrence (the longest match's first continuation in the log), frequent (below `long_match`
tokens, the best-scored path over occurrence counts pooled across the sources: `_frequent`), and
adaptive (per group, whichever of the two has been winning: `_adaptive`); the draft length follows
the match length (`length_cap`). `step_rows` syncs a batch's rows (`build.sync_rows`) and drafts
for it in one call.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .build import min_length, normalise, sync_rows
from .edges import get_edge
from .layout import (
    M_WINS,
    MB_STATE,
    NUM_HISTORY,
    OK,
    R_AUTO,
    R_GUESS,
    R_HIST,
    R_MEMBER,
    R_STORE,
    R_STORE_AUTO,
    R_TOKENS,
    S_COUNT,
    S_LEN,
    S_LINK,
    S_REP,
    S_TOKEN,
    SOURCE_GROUP,
    SOURCE_HISTORY,
    SOURCE_NONE,
    SOURCE_STORE,
    STATE_WIDTH,
    T_EDGES,
    T_LOG,
    T_STATES,
    view,
)
from .token_log import continuation_length, copy_continuation, follower

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

# adaptive: the first occurrence is drafted while its wins (M_WINS) exceed the frequent one's by this
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
            work[W_STATE + i] = normalise(view(table, a, T_STATES), cursor[r, field], cursor[r, field + 1])
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
        if n == 0 and work[W_PATH] > 0:
            total -= 1.0  # the group holds the request's own text: its end here has no continuation yet
        for i in range(NUM_SOURCES):
            u = work[W_PATH + i]
            if u > 0:
                states = view(table, work[W_AUTO + i], T_STATES)
                if length + n > deep and min_length(states, u) > deep:
                    work[W_PATH + i] = -1
                else:
                    total += _count(states, u)
        if total <= 0.0:
            break
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
                work[W_STATE + i] = normalise(view(table, work[W_AUTO + i], T_STATES), work[W_STATE + i], m)
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


@njit(cache=True, nogil=True)  # entry points release the GIL: the async route drafts in a thread
def propose_batch(table, meta, cursor, history, slots, k, policy, work, scratch, out, out_len, out_match, out_source):
    """Drafts for requests slots[i] into out[i, :out_len[i]]."""
    for i in range(slots.size):
        out_len[i], out_match[i], out_source[i] = _propose_one(
            table, meta, cursor, history, slots[i], k, policy, work, scratch, out[i]
        )


@njit(cache=True, nogil=True)
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
    proposing,
    policy,
    work,
    scratch,
    out,
    out_len,
    out_match,
    out_source,
):
    """sync_rows for `slots`, then propose_batch for `proposing` (slots too, or some of them), in one
    call. Every request is synced before any proposes, so a sibling's tokens of this step count
    whatever the row order. Returns sync_rows' answer."""
    code = sync_rows(table, meta, cursor, history, slots, rows, row_lengths, need, int(policy[P_COUNT_DEPTH]))
    if code == OK and k > 0:
        propose_batch(
            table, meta, cursor, history, proposing, k, policy, work, scratch, out, out_len, out_match, out_source
        )
    return code
