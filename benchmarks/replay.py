"""Honest lockstep replay of real sampled outputs: how many tokens would each drafter let a step emit?

For every group (a prompt and its sampled responses, i.e. GRPO siblings) in order:
- the first response token comes from prefill, without a draft;
- then each step proposes k tokens for every active sibling from the state after the previous step,
  accepts the longest draft prefix that matches the real continuation, and advances by accepted + 1
  (the bonus token);
- only after all siblings' drafts are proposed are that step's tokens appended to anyone.
Histories see only responses that finished earlier.

Replaying real sampled outputs is a faithful estimate for point-mass drafts: a draft token x is
accepted with probability p(x), the chance that the sample equals x.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from testkit.data import TraceGroup

POSITION_BINS = (0, 128, 256, 512, 1024, 2048)


def bin_labels(edges=POSITION_BINS) -> list[str]:
    """'lo-hi' for each bin of lower edges `edges`; the last bin is open-ended ('lo+')."""
    bounds = list(edges) + [None]
    return [f"{lo}-{hi}" if hi else f"{lo}+" for lo, hi in zip(bounds[:-1], bounds[1:])]


@dataclass
class ReplayStats:
    """Counts over all decode steps of all requests (prefill steps excluded), in total and per bin of
    response position (`bin_edges`: increasing lower edges from 0; the last bin is open-ended)."""

    steps: int = 0
    tokens: int = 0  # tokens emitted by those steps: accepted + bonus
    drafted: int = 0
    accepted: int = 0
    bin_edges: tuple[int, ...] = POSITION_BINS
    bin_steps: np.ndarray = field(init=False)
    bin_tokens: np.ndarray = field(init=False)
    bin_drafted: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        edges = np.asarray(self.bin_edges)
        if edges.ndim != 1 or not edges.size or edges[0] != 0 or np.any(np.diff(edges) <= 0):
            raise ValueError(f"bin_edges must increase from 0, got {self.bin_edges!r}")
        self.bin_edges = tuple(int(e) for e in edges)
        self.bin_steps = np.zeros(len(edges), dtype=np.int64)
        self.bin_tokens = np.zeros(len(edges), dtype=np.int64)
        self.bin_drafted = np.zeros(len(edges), dtype=np.int64)

    def add(self, other: ReplayStats) -> None:
        """Count another replay's steps here too (same bins)."""
        if other.bin_edges != self.bin_edges:
            raise ValueError(f"bins differ: {other.bin_edges} against {self.bin_edges}")
        self.steps += other.steps
        self.tokens += other.tokens
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.bin_steps += other.bin_steps
        self.bin_tokens += other.bin_tokens
        self.bin_drafted += other.bin_drafted

    def record(self, position: int, drafted: int, accepted: int, emitted: int) -> None:
        b = int(np.searchsorted(self.bin_edges, position, side="right")) - 1
        self.steps += 1
        self.tokens += emitted
        self.drafted += drafted
        self.accepted += accepted
        self.bin_steps[b] += 1
        self.bin_tokens[b] += emitted
        self.bin_drafted[b] += drafted

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per decode step, bonus included (1.0 = no speculation gain)."""
        return self.tokens / max(self.steps, 1)

    @property
    def draft_efficiency(self) -> float:
        """Accepted draft tokens per drafted token: how much verification is not wasted."""
        return self.accepted / max(self.drafted, 1)

    def by_position(self) -> list[float | None]:
        return [float(t / s) if s else None for t, s in zip(self.bin_tokens, self.bin_steps)]

    def drafted_by_position(self) -> list[float | None]:
        return [float(d / s) if s else None for d, s in zip(self.bin_drafted, self.bin_steps)]

    def as_dict(self) -> dict:
        return {
            "acceptance_length": self.acceptance_length,
            "draft_efficiency": self.draft_efficiency,
            "drafted_per_step": self.drafted / max(self.steps, 1),
            "steps": self.steps,
            "tokens": self.tokens,
            "by_position": dict(zip(bin_labels(self.bin_edges), self.by_position())),
            "drafted_by_position": dict(zip(bin_labels(self.bin_edges), self.drafted_by_position())),
            "steps_by_position": dict(zip(bin_labels(self.bin_edges), self.bin_steps.tolist())),
        }


def _accepted_prefix(draft: np.ndarray, truth: np.ndarray) -> int:
    n = min(len(draft), len(truth))
    mismatch = np.flatnonzero(draft[:n] != truth[:n])
    return int(mismatch[0]) if mismatch.size else n


def replay_group(drafter, g: int | str, group: TraceGroup, k: int, stats: ReplayStats) -> None:
    ids = [f"{g}/{i}" for i in range(len(group.responses))]
    texts = [np.concatenate([group.prompt, r]) for r in group.responses]
    plen = len(group.prompt)
    done = [0] * len(ids)  # response tokens emitted so far
    active = [i for i, r in enumerate(group.responses) if len(r) > 0]
    for i in range(len(ids)):
        drafter.start(ids[i], group.prompt, group=str(g))
        if i not in active:
            drafter.finish(ids[i])  # an empty response ends at prefill
    if active:  # prefill emits each sibling's first token
        drafter.extend([ids[i] for i in active], [group.responses[i][:1] for i in active])
        for i in active:
            done[i] = 1
    while True:
        for i in [i for i in active if done[i] >= len(group.responses[i])]:
            drafter.finish(ids[i])
        active = [i for i in active if done[i] < len(group.responses[i])]
        if not active:
            break
        drafts = drafter.propose([ids[i] for i in active], [texts[i][: plen + done[i]] for i in active], k)
        new_tokens = []
        for i, draft in zip(active, drafts):
            response = group.responses[i]
            accepted = _accepted_prefix(np.asarray(draft), response[done[i] : done[i] + len(draft)])
            emitted = min(accepted + 1, len(response) - done[i])
            stats.record(done[i], len(draft), min(accepted, emitted), emitted)
            new_tokens.append(response[done[i] : done[i] + emitted])
        drafter.extend([ids[i] for i in active], new_tokens)
        for i, tokens in zip(active, new_tokens):
            done[i] += len(tokens)


def replay(drafter, groups: list[TraceGroup], k: int = 3, bin_edges=POSITION_BINS) -> ReplayStats:
    """Replay the groups in order through one drafter, whose state (history) persists across groups."""
    stats = ReplayStats(bin_edges=tuple(bin_edges))
    for g, group in enumerate(groups):
        replay_group(drafter, g, group, k, stats)
    return stats


ALL = "all"


def replay_by_part(
    drafter, groups: list[TraceGroup], parts: Sequence[str], k: int = 3, bin_edges=POSITION_BINS
) -> dict[str, ReplayStats]:
    """`replay`, with each group's steps counted under its part (parts[g], e.g. tuning or held-out
    prompts) as well as under ALL: one drafter sees every group, so the parts share its history."""
    stats = {name: ReplayStats(bin_edges=tuple(bin_edges)) for name in (ALL, *parts)}
    for g, (group, part) in enumerate(zip(groups, parts, strict=True)):
        scored = ReplayStats(bin_edges=tuple(bin_edges))
        replay_group(drafter, g, group, k, scored)
        stats[ALL].add(scored)
        stats[part].add(scored)
    return stats


def replay_visits(
    drafter, visits: list[list[tuple[str, TraceGroup]]], parts: dict[str, str], k: int = 3, bin_edges=POSITION_BINS
) -> dict[str, ReplayStats]:
    """Visits in order (a training run's checkpoints, say), each a list of (prompt key, group), through one
    drafter. Only revisits are scored: a group whose prompt key was visited before, under its part
    (parts[key]) and ALL; first visits only feed the drafter (history, prompt store)."""
    stats = {name: ReplayStats(bin_edges=tuple(bin_edges)) for name in (ALL, *parts.values())}
    seen: set[str] = set()
    for v, visit in enumerate(visits):
        for key, group in visit:
            scored = ReplayStats(bin_edges=tuple(bin_edges))
            replay_group(drafter, f"visit{v}-{key}", group, k, scored)
            if key in seen:
                stats[ALL].add(scored)
                stats[parts[key]].add(scored)
        seen.update(key for key, _ in visit)
    return stats


EARLIER_VISIT = 4  # responses per group that stand in for the prompt's previous visit


def replay_revisits(
    drafter, groups: list[TraceGroup], k: int = 3, earlier: int = EARLIER_VISIT, bin_edges=POSITION_BINS
) -> ReplayStats:
    """Epoch-spaced revisit proxy: each group's first `earlier` responses are the prompt's previous
    visit, the others its current visit. Every prompt's previous visit is replayed first (one epoch),
    then every current visit, through the same drafter; only the current visits are scored."""
    if not all(0 < earlier < len(g.responses) for g in groups):
        raise ValueError(f"every group needs more than {earlier} responses to split off an earlier visit")
    for g, group in enumerate(groups):
        earlier_visit = TraceGroup(group.prompt, group.responses[:earlier])
        replay_group(drafter, f"earlier-{g}", earlier_visit, k, ReplayStats(bin_edges=tuple(bin_edges)))
    stats = ReplayStats(bin_edges=tuple(bin_edges))
    for g, group in enumerate(groups):
        replay_group(drafter, f"current-{g}", TraceGroup(group.prompt, group.responses[earlier:]), k, stats)
    return stats


def with_replaced_tokens(groups: list[TraceGroup], rate: float, earlier: int = EARLIER_VISIT, seed: int = 0):
    """The groups with a fraction `rate` of each earlier-visit response's tokens replaced by tokens
    drawn from the same response: a crude stand-in for the policy drifting between visits (the
    current visits are untouched)."""
    rng = np.random.default_rng(seed)
    out = []
    for g in groups:
        changed = []
        for r in g.responses[:earlier]:
            r = r.copy()
            where = rng.random(r.size) < rate
            r[where] = rng.choice(r, size=int(where.sum())) if r.size else r[where]
            changed.append(r)
        out.append(TraceGroup(g.prompt, changed + list(g.responses[earlier:])))
    return out
