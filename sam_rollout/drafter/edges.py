"""Edge blocks: the out-edges of a state beyond its inline first one (see `layout`).

A block id is (size class << OFFSET_BITS) | offset in pairs. Classes 0..3 hold 1, 2, 4 or 8 pairs,
scanned linearly; classes from FIRST_HASH_CLASS on are open-addressing hash tables with a header pair
holding the degree, kept at most half full. A full block moves to the next class; freed blocks go to
per-class free lists in the automaton's meta. Callers reserve the pairs (`pairs_needed`).
"""

from __future__ import annotations

from numba import njit

from .layout import (
    FIRST_HASH_CLASS,
    M_FREE,
    M_PAIRS,
    MAX_LINEAR_CLASS,
    NO_BLOCK,
    NO_EDGE,
    OFFSET_BITS,
    OFFSET_MASK,
    S_BLOCK,
    S_LEN,
    S_LINK,
    S_TARGET,
    S_TOKEN,
    STATE_WIDTH,
)


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


@njit(cache=True, inline="always")
def copy_block(edges, m, block):
    """A new block of the same class holding block's edges (a clone's; room reserved by the caller)."""
    copy = _alloc_block(edges, m, block >> OFFSET_BITS)
    _move_edges(edges, block, copy)
    return copy


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
