"""The array layout of the compiled drafter: field constants, fresh arrays, and `view`.

Each automaton `a` has three int32 arrays, owned by Python (`sam_rollout.drafter.batch._Automata`; large ones in huge
pages, `sam_rollout.drafter.pages`) and reached from compiled code through `table[a]`, which holds each array's address
and length:

- `states[a]`: int32, `STATE_WIDTH` fields per state: length, suffix link, `rep` (the log position
  of the state's first occurrence, i.e. min endpos in insertion order), its first out-edge inline
  (token, target; 94% of states have exactly one edge, so a walk rarely leaves the state record),
  the block holding its other edges, and `count`, its number of end positions (occurrences).
- `edges[a]`: int32 (token, target) pairs for the edges beyond the first. Blocks of 1, 2, 4 or 8
  pairs are scanned linearly; larger blocks are open-addressing hash tables keyed by token, with a
  header pair holding the degree. Freed blocks go to per-class free lists (`edges`).
- `logs[a]`: int32 token log in chunks of `CHUNK` slots; the last slot of a chunk links to the
  member's next chunk (`token_log`).

Per-automaton counters live in `meta[a]` (int64); per-request cursors in `cursor[r]` (int64).

Compiled code reaches an automaton by id through `table` (`view`), never by indexing a tuple of
arrays at run time: numba copies such a tuple and counts references on every access, which cost more
than a whole draft.

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
# M_WINS's units: each disagreement decays both wins by 1/2**WIN_SHIFT (a memory of ~128 disagreements)
WIN_SHIFT = 7
WIN_UNIT = 1 << 16

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
