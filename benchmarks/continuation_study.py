"""Which occurrence should a draft follow? A measurement on the plain-Python reference automaton.

The compiled drafter follows the *first* occurrence of the longest repeated suffix. Two alternatives:
- *recent*: the latest earlier occurrence that has a follower;
- *frequent*: from the matched state, repeatedly take the next token seen most often after it.
Both need per-state bookkeeping along the whole suffix-link path on every append (O(depth), not O(1)),
so they are only worth building into the compiled core if they win here.

    python -m benchmarks.continuation_study [--groups N]
"""

from __future__ import annotations

import argparse

from sam.reference import ReferenceAutomaton

from .data import load_trace_groups
from .replay import replay

POLICIES = ("first", "recent", "frequent")


class StudyAutomaton(ReferenceAutomaton):
    """The reference automaton plus, per state, its occurrence count and its two latest end times."""

    def __init__(self) -> None:
        super().__init__()
        self.count = [0]
        self.last_end = [-1]
        self.prev_end = [-1]
        self._clone_of: dict[int, int] = {}

    def _clone(self, q: int, length: int) -> int:
        c = super()._clone(q, length)
        self._clone_of[c] = q
        return c

    def append(self, member: int, token: int) -> None:
        super().append(member, token)
        for s in range(len(self.count), len(self.states)):  # new states: clones copy their origin
            q = self._clone_of.pop(s, None)
            self.count.append(self.count[q] if q is not None else 0)
            self.last_end.append(self.last_end[q] if q is not None else -1)
            self.prev_end.append(self.prev_end[q] if q is not None else -1)
        now = self.member_time[member]
        v = self.member_last[member]
        while v > 0:  # every suffix of the member's text now also ends at `now`
            self.count[v] += 1
            self.prev_end[v], self.last_end[v] = self.last_end[v], now
            v = self.states[v].link

    def draft_with(self, member: int, k: int, policy: str) -> list[int]:
        s = self.member_last[member]
        now = self.member_time[member]
        while s > 0:
            if policy == "first" or (policy == "recent" and not self._recent_ok(s, now)):
                cont = self.continuation(self.states[s].rep, k)
            elif policy == "recent":
                cont = self.continuation(self._recent(s, now), k)
            else:
                cont = self._frequent(s, k)
            if cont:
                return cont
            s = self.states[s].link
        return []

    def _recent(self, s: int, now: int) -> int:
        return self.prev_end[s] if self.last_end[s] == now else self.last_end[s]

    def _recent_ok(self, s: int, now: int) -> bool:
        t = self._recent(s, now)
        return t >= 0 and bool(self.continuation(t, 1))

    def _frequent(self, s: int, k: int) -> list[int]:
        out = []
        while len(out) < k and self.states[s].next:
            token, s = max(self.states[s].next.items(), key=lambda item: self.count[item[1]])
            out.append(token)
        return out


class StudyDrafter:
    """ReplayDrafter over StudyAutomaton: one automaton per group (group-aware) or per request."""

    def __init__(self, policy: str, group_aware: bool) -> None:
        self.policy, self.group_aware = policy, group_aware
        self.name = f"reference, {'group' if group_aware else 'own'}, {policy}"
        self._groups: dict = {}
        self._member: dict = {}

    def start(self, req_id, prompt, group):
        key = group if self.group_aware else req_id
        if key not in self._groups:
            auto = StudyAutomaton()
            shared = auto.add_member()
            for token in prompt.tolist():
                auto.append(shared, token)
            self._groups[key] = (auto, shared, [0])
        auto, shared, live = self._groups[key]
        live[0] += 1
        self._member[req_id] = (key, auto.add_member(shared))

    def propose(self, req_ids, contexts, k):
        import numpy as np

        out = []
        for req_id in req_ids:
            key, member = self._member[req_id]
            out.append(np.asarray(self._groups[key][0].draft_with(member, k, self.policy), dtype=np.int32))
        return out

    def extend(self, req_ids, new_tokens):
        for req_id, tokens in zip(req_ids, new_tokens):
            key, member = self._member[req_id]
            auto = self._groups[key][0]
            for token in tokens.tolist():
                auto.append(member, token)

    def finish(self, req_id):
        key, _ = self._member.pop(req_id)
        live = self._groups[key][2]
        live[0] -= 1
        if live[0] == 0:
            del self._groups[key]


def run(groups, k: int = 3) -> dict[str, float]:
    """Mean acceptance length of each policy, own context and group-aware."""
    results = {}
    for group_aware in (False, True):
        for policy in POLICIES:
            drafter = StudyDrafter(policy, group_aware)
            results[drafter.name] = replay(drafter, groups, k).acceptance_length
            print(f"  {drafter.name:<42} {results[drafter.name]:.3f}", flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--k", type=int, default=3)
    args = parser.parse_args(argv)
    groups = load_trace_groups(args.groups)
    print(f"Continuation policies on {len(groups)} groups, k={args.k} (mean acceptance length):")
    return run(groups, args.k)


if __name__ == "__main__":
    main()
