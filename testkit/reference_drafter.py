"""Plain-Python reference drafters: the definitions the compiled core is tested against.

`ReferenceAutomaton` is a generalised suffix automaton over several token streams ("members") that
grow interleaved, e.g. a prompt and the responses of its GRPO siblings. Every appended token gets a
global *time* (its index in the insertion log); a state's `rep` is the earliest time in its endpos
set, so drafting from it gives the first occurrence in insertion order.

`brute_force_draft` defines what a draft is, with no automaton at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _State:
    length: int
    link: int
    rep: int  # earliest end time of this state's strings (min endpos)
    next: dict[int, int] = field(default_factory=dict)


class ReferenceAutomaton:
    """Generalised online suffix automaton with per-member cursors.

    A member is created with `add_member(parent)`: it continues the text of `parent` (a member whose
    last token becomes its first context), or starts empty with `parent=None`.
    """

    def __init__(self) -> None:
        self.states = [_State(length=0, link=-1, rep=-1)]
        self.log_token: list[int] = []  # token at each time
        self.log_next: list[int] = []  # time of the next token of the same member, -1 if none yet
        self.log_prev: list[int] = []  # time of the previous token in the member's text, -1 at start
        self.member_last: list[int] = []  # state of each member's whole text
        self.member_time: list[int] = []  # time of each member's last token, -1 if empty

    def add_member(self, parent: int | None = None) -> int:
        self.member_last.append(0 if parent is None else self.member_last[parent])
        self.member_time.append(-1 if parent is None else self.member_time[parent])
        return len(self.member_last) - 1

    def append(self, member: int, token: int) -> None:
        time = len(self.log_token)
        prev_time = self.member_time[member]
        self.log_token.append(token)
        self.log_next.append(-1)
        self.log_prev.append(prev_time)
        if prev_time >= 0 and self.log_next[prev_time] < 0:
            # The first continuation of a shared position (e.g. the prompt's end) is the one drafts follow.
            self.log_next[prev_time] = time
        self.member_last[member] = self._extend(self.member_last[member], token, time)
        self.member_time[member] = time

    def _clone(self, q: int, length: int) -> int:
        src = self.states[q]
        self.states.append(_State(length=length, link=src.link, rep=src.rep, next=dict(src.next)))
        return len(self.states) - 1

    def _extend(self, last: int, token: int, time: int) -> int:
        states = self.states
        if token in states[last].next:
            # The member's new text already occurs: reuse (or split) the existing state.
            q = states[last].next[token]
            if states[q].length == states[last].length + 1:
                return q
            clone = self._clone(q, states[last].length + 1)
            p = last
            while p != -1 and states[p].next.get(token) == q:
                states[p].next[token] = clone
                p = states[p].link
            states[q].link = clone
            return clone
        cur = len(states)
        states.append(_State(length=states[last].length + 1, link=0, rep=time))
        p = last
        while p != -1 and token not in states[p].next:
            states[p].next[token] = cur
            p = states[p].link
        if p != -1:
            q = states[p].next[token]
            if states[p].length + 1 == states[q].length:
                states[cur].link = q
            else:
                clone = self._clone(q, states[p].length + 1)
                while p != -1 and states[p].next.get(token) == q:
                    states[p].next[token] = clone
                    p = states[p].link
                states[q].link = clone
                states[cur].link = clone
        return cur

    def continuation(self, time: int, k: int) -> list[int]:
        out: list[int] = []
        t = self.log_next[time] if time >= 0 else -1
        while t >= 0 and len(out) < k:
            out.append(self.log_token[t])
            t = self.log_next[t]
        return out

    def draft(self, member: int, k: int) -> tuple[list[int], int]:
        """Continuation after the first earlier occurrence of the member's longest repeated suffix."""
        s = self.member_last[member]
        while s > 0:  # a state whose first occurrence has no follower yet drafts nothing; try shorter
            cont = self.continuation(self.states[s].rep, k)
            if cont:
                return cont, self.states[s].length
            s = self.states[s].link
        return [], 0


def _text_ending_at(ref: ReferenceAutomaton, time: int) -> list[int]:
    out = []
    while time >= 0:
        out.append(ref.log_token[time])
        time = ref.log_prev[time]
    return out[::-1]


def _common_suffix(ref: ReferenceAutomaton, a: int, b: int) -> int:
    """Length of the common suffix of the texts ending at times a and b."""
    n = 0
    while a >= 0 and b >= 0 and ref.log_token[a] == ref.log_token[b]:
        if a == b:  # the same position: everything before it is shared too
            return n + len(_text_ending_at(ref, a))
        n += 1
        a, b = ref.log_prev[a], ref.log_prev[b]
    return n


def _draft_from_matches(ref: ReferenceAutomaton, common: list[int], k: int) -> tuple[list[int], int]:
    """Given the common-suffix length of a text with the text ending at every time of `ref`: among
    the suffixes whose first occurrence (in insertion time) is followed by at least one token, take
    the longest, and draft what follows that first occurrence."""
    for length in range(max(common, default=0), 0, -1):
        first = next(t for t, n in enumerate(common) if n >= length)
        cont = ref.continuation(first, k)
        if cont:
            return cont, length
    return [], 0


def brute_force_draft(ref: ReferenceAutomaton, member: int, k: int) -> tuple[list[int], int]:
    """The draft by definition, with no automaton: `_draft_from_matches` of the member's own text.

    For a single stream the member's own last token has no follower, so this is the longest
    *repeated* suffix; a member that shares its position with another (siblings at the prompt's end)
    drafts what the other appended there.
    """
    now = ref.member_time[member]
    return _draft_from_matches(ref, [_common_suffix(ref, now, t) for t in range(len(ref.log_token))], k)


def brute_force_history_draft(history: list[list[int]], text: list[int], k: int) -> tuple[list[int], int]:
    """The draft for `text` from a corpus of finished responses, each a member of its own."""
    ref = ReferenceAutomaton()
    for response in history:
        m = ref.add_member()
        for token in response:
            ref.append(m, token)
    common = []
    for t in range(len(ref.log_token)):
        n, a = 0, t
        while a >= 0 and n < len(text) and ref.log_token[a] == text[-1 - n]:
            n += 1
            a = ref.log_prev[a]
        common.append(n)
    return _draft_from_matches(ref, common, k)


# ------------------------------------------------------------------ the frequent continuation -------
# Definitions by brute force over the insertion log: what `continuation="frequent"` drafts. A source is
# a ReferenceAutomaton (the group: prompt and members; a history: finished responses, one member each).


def _ends_with(ref: ReferenceAutomaton, time: int, string: list[int]) -> bool:
    for token in reversed(string):
        if time < 0 or ref.log_token[time] != token:
            return False
        time = ref.log_prev[time]
    return True


def end_times(ref: ReferenceAutomaton, string: list[int]) -> list[int]:
    """The log times at which `string` ends (its occurrences, in insertion order)."""
    return [t for t in range(len(ref.log_token)) if _ends_with(ref, t, string)]


def shortest_equivalent(ref: ReferenceAutomaton, string: list[int]) -> int:
    """Length of the shortest suffix of `string` that ends exactly where `string` ends (the shortest
    string of its automaton state)."""
    ends = end_times(ref, string)
    return next(j for j in range(1, len(string) + 1) if end_times(ref, string[-j:]) == ends)


def kept_follower(ref: ReferenceAutomaton, string: list[int], recency_weight: float = 1.0) -> int | None:
    """The continuation of `string` that drafts follow, replayed over its occurrences in insertion
    order: the first follower, replaced by a follower just seen once that one's count times
    `recency_weight` reaches the kept one's (in whole percent, as the core compares)."""
    percent = round(100 * recency_weight)
    counts: dict[int, int] = {}
    kept = None
    for time, token in enumerate(ref.log_token):
        if not _ends_with(ref, ref.log_prev[time], string):
            continue
        counts[token] = counts.get(token, 0) + 1
        if kept is None or (token != kept and percent * counts[token] >= 100 * counts[kept]):
            kept = token
    return kept


def _first_occurrence_match(ref, text, length, k, longer_than):
    """(match, continuation) for the longest suffix of `text` (at most `length` tokens, more than
    `longer_than`) whose first occurrence in `ref` has a follower."""
    for m in range(length, longer_than, -1):
        ends = end_times(ref, text[-m:])
        if ends:
            cont = ref.continuation(ends[0], k)
            if cont:
                return m, cont
    return 0, []


def _matched_length(ref: ReferenceAutomaton, text: list[int]) -> int:
    return next((m for m in range(len(text), 0, -1) if end_times(ref, text[-m:])), 0)


def _source_lengths(sources: list[ReferenceAutomaton], text: list[int]) -> list[int]:
    """Each source's longest match: the whole text in the group (sources[0]), which holds it."""
    return [len(text)] + [_matched_length(ref, text) for ref in sources[1:]]


def brute_force_first_draft(
    sources: list[ReferenceAutomaton], text: list[int], k: int, longer_than: int = 0
) -> tuple[list[int], int, int | None]:
    """The longest match over several sources (group first: it holds `text` as a member; then any
    others, e.g. stored responses and history) whose first occurrence has a follower, longer than
    `longer_than`; ties: the earlier source. (continuation, match length, source index or None)."""
    best_match, best_cont, best_source = 0, [], None
    for i, (ref, length) in enumerate(zip(sources, _source_lengths(sources, text))):
        m, cont = _first_occurrence_match(ref, text, length, k, longer_than)
        if m > best_match:
            best_match, best_cont, best_source = m, cont, i
    return best_cont, best_match, best_source


def _pooled_path(sources, on, string, cap, min_prob, prior, score_depth, recency_weight, gated=0):
    """The best-counted of the sources' kept continuations of `string`, over the pooled counts of
    sources `on`; min_prob stops it from its `gated`-th token on."""
    p, score, out, first_source = 1.0, 0.0, [], None
    while len(out) < cap:
        on = [i for i in on if shortest_equivalent(sources[i], string) <= score_depth]
        total = prior - (1 if not out and 0 in on else 0)  # the text's own end (in the group) has no follower
        for i in on:
            total += len(end_times(sources[i], string))
        if total <= 0:
            break
        best, best_count, best_source = None, 0, None
        for i in on:
            token = kept_follower(sources[i], string, recency_weight)
            if token is None:
                continue
            counts = [len(end_times(sources[j], string + [token])) for j in on]
            if sum(counts) > best_count:
                best, best_count = token, sum(counts)
                best_source = on[counts.index(max(counts))]
        if best is None:
            break
        p *= min(1.0, best_count / total)
        if p < min_prob and len(out) >= gated:
            break
        out.append(best)
        score += p
        first_source = best_source if first_source is None else first_source
        string = string + [best]
        on = [j for j in on if end_times(sources[j], string)]
    return out, score, first_source


@dataclass(frozen=True)
class MatchLength:
    """length_policy "match": base_k tokens, or floor(match_scale * match) where that is more."""

    base_k: int
    match_scale: float


def draft_length(match: int, k: int, min_match: int = 1, scaled: bool = False, by_match: MatchLength | None = None):
    """The most tokens a draft from a match of this length takes: none below min_match; k ("fixed");
    one per matched token beyond min_match - 1 ("scaled"); or `by_match` ("match"); all capped at k."""
    if match < min_match or match == 0:
        return 0
    if by_match is not None:
        return min(k, max(by_match.base_k, math.floor(by_match.match_scale * match)))
    return min(k, match - min_match + 1) if scaled else k


def brute_force_frequent_draft(
    sources: list[ReferenceAutomaton],
    text: list[int],
    k: int,
    min_match: int = 1,
    scaled: bool = False,
    min_prob: float = 0.0,
    prior: float = 1.0,
    long_match: int = 8,
    score_depth: int | None = None,
    recency_weight: float = 1.0,
    by_match: MatchLength | None = None,
) -> tuple[list[int], int, int | None]:
    """The frequent draft by definition: (tokens, match length, source index or None).

    sources[0] is the group (it holds `text` as a member, so every suffix occurs there), then the
    group's stored responses and the history generations, newest first, where present. A match
    longer than `long_match` whose first occurrence has a follower wins as in
    `brute_force_first_draft`. Otherwise every matched length from min(long_match, longest match)
    down to min_match is scored, over the counts pooled across the sources holding it, then over the
    group alone: the draft follows, of the sources' kept continuations (`kept_follower`), the one
    with the most pooled occurrences, while the product of its estimated probabilities (count /
    (context count + prior), at most 1; the first token's context count leaves out the text's own end,
    which has no follower yet) stays >= min_prob, a source dropping out where the string
    stops occurring in it or stops being at most `sam_rollout.drafter.layout.score_depth(long_match)` tokens long in
    its shortest form; the score is the sum of those products, and the best score wins (ties: the
    pooled pass, the longer match). The `score_depth` argument only exists to show where that depth
    matters. With `by_match` (length_policy "match") every draft's length is capped by `draft_length`
    and min_prob applies from its base_k-th token on.
    """
    from sam_rollout.drafter.layout import score_depth as default_depth

    score_depth = default_depth(long_match) if score_depth is None else score_depth
    lengths = _source_lengths(sources, text)
    best_cont, best_match, best_source = brute_force_first_draft(sources, text, k, long_match)
    if best_match:
        count = min(draft_length(best_match, k, min_match, scaled, by_match), len(best_cont))
        return (best_cont[:count], best_match, best_source) if count > 0 else ([], best_match, None)
    best = ([], 0, None, 0.0)
    passes = [list(range(len(sources)))] + ([[0]] if len(sources) > 1 else [])
    for allowed in passes:
        for m in range(min(long_match, max(lengths[i] for i in allowed)), max(min_match, 1) - 1, -1):
            on = [i for i in allowed if lengths[i] >= m]
            cap = draft_length(m, k, min_match, scaled, by_match)
            gated = by_match.base_k if by_match is not None else 0
            tokens, score, source = _pooled_path(
                sources, on, text[-m:], cap, min_prob, prior, score_depth, recency_weight, gated
            )
            if tokens and score > best[3]:
                best = (tokens, m, source, score)
    return best[0], best[1], best[2]
