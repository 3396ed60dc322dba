"""The token log: each member's text in chunks of CHUNK int32 slots (see `layout`).

The last slot of a chunk links to the member's next chunk. A position's follower is the next slot,
so a draft is a short walk, and a member that shares a position with another (siblings at the
prompt's end) starts a chunk of its own. Empty slots hold -1.
"""

from __future__ import annotations

from numba import njit

from .layout import CHUNK, M_LOG, M_TOKENS


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
