"""sam_rollout.drafter.auto_switch: the online switch learns a step cost and the drafts' acceptance from the
steps it sees, and chooses k per step close to what the true cost model would choose, exploring little."""

from __future__ import annotations

import numpy as np
import pytest

from sam_rollout.drafter import auto_switch as sw
from sam_rollout.drafter.auto_switch import AutoSwitch

K = 3


class Engine:
    """A synthetic engine: step time T0(B) * (1 + s(B) * d) with multiplicative noise, and draft tokens
    accepted position by position with probability ``alpha`` each (rows drafted with probability f)."""

    def __init__(self, slope, alpha=0.6, f=0.8, noise=0.05, seed=0):
        self.slope, self.alpha, self.f, self.noise = slope, alpha, f, noise
        self.rng = np.random.default_rng(seed)

    def plain_ms(self, batch):
        return 20.0 + 2.0 * batch

    def drafts(self, batch, k):
        """(draft length, accepted length) per request for drafts of k tokens."""
        drafted = np.where(self.rng.random(batch) < self.f, k, 0)
        accepted = np.zeros(batch, dtype=np.int64)
        for j in range(1, k + 1):
            accepted += (accepted == j - 1) & (drafted >= j) & (self.rng.random(batch) < self.alpha)
        return drafted, accepted

    def step(self, batch, k):
        drafted, accepted = self.drafts(batch, k)
        d = drafted.mean()
        ms = self.plain_ms(batch) * (1 + self.slope(batch) * d) * np.exp(self.noise * self.rng.standard_normal())
        return ms, d, batch + accepted.sum()

    def score(self, batch):
        """A scoring round: full drafts, scored whether or not they were sent."""
        drafted, accepted = self.drafts(batch, K)
        drafted_at = np.array([0.0] + [(drafted >= j).sum() for j in range(1, K + 1)])
        accepted_at = np.array([0.0] + [(accepted >= j).sum() for j in range(1, K + 1)])
        return drafted_at, accepted_at

    def best_k(self, batch):
        gains = [self.tokens_per_request(k) / (1 + self.slope(batch) * self.f * k) for k in range(K + 1)]
        return int(np.argmax(gains)), max(gains)

    def tokens_per_request(self, k):
        return 1 + self.f * sum(self.alpha**j for j in range(1, k + 1))


def run(switch, engine, batches):
    """Drive the switch through steps of the given batch sizes; returns (k per step, tokens, ms)."""
    ks, tokens, total_ms = [], 0.0, 0.0
    for step, b in enumerate(batches):
        k = switch.choose_k(b)
        ms, d, emitted = engine.step(b, k)
        switch.observe_cost(b, d, ms)
        if getattr(switch, "learns_acceptance", False) and step % switch.score_every == 0:
            switch.observe_acceptance(b, *engine.score(b))
        ks.append(k)
        tokens += emitted
        total_ms += ms
    return np.array(ks), tokens, total_ms


def test_buckets_are_half_powers_of_two():
    assert [sw.bucket_of(b) for b in (1, 2, 3, 4, 6, 8, 11, 16, 23, 32)] == [0, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert sw.bucket_range(sw.bucket_of(100)) == (77, 107)  # 2 log2(b) rounds to 13
    assert sw.bucket_of(10**9) == sw.NUM_BUCKETS - 1


def test_a_new_bucket_measures_plain_then_drafted_steps_then_decides():
    switch = AutoSwitch(K)
    engine = Engine(slope=lambda b: 0.0, noise=0.0)
    ks, _, _ = run(switch, engine, [16] * 6)
    assert ks.tolist()[:2] == [0, 0]  # two plain steps
    probe = sw.best_k_at(switch.accept, 0.0, sw.PROBE_SLOPE, K)
    assert 0 < probe < K and ks.tolist()[2:4] == [probe, probe]  # two drafted steps, at a middling cost's k
    assert ks[4] == K  # free drafts that are accepted: draft in full


@pytest.mark.parametrize("alpha, expected_probe", [(0.15, 1), (0.9, K)])
def test_a_bucket_measures_with_the_k_a_middling_cost_would_take(alpha, expected_probe):
    """Measuring steps cost what they draft: at sampled acceptance, one draft token a request (a full draft
    costs about three times as much on a CPU, where each token is a sizeable share of the step)."""
    switch = AutoSwitch(K)
    engine = Engine(slope=lambda b: 0.5, alpha=alpha, f=0.9, noise=0.0)
    ks, _, _ = run(switch, engine, [16] * 4)
    assert ks.tolist() == [0, 0, expected_probe, expected_probe]


def test_a_shrinking_batch_at_low_acceptance_costs_little_to_learn():
    """The demo's sampled batch: 32 requests that finish at different lengths, a few steps in each bucket,
    drafts that rarely pay (s 0.3-0.6 against first-position acceptance 0.3). Each bucket measures its own
    cost; with full drafts that cost 9% on average over these seeds (up to 17%), with the k a middling
    cost would take, 1% (up to 4.5%)."""
    batches = np.repeat(np.arange(32, 0, -1), 4)
    ratios = []
    for seed in range(6):
        engine = Engine(slope=lambda b: 0.25 + 0.01 * b, alpha=0.3, f=0.9, noise=0.1, seed=seed)
        engine.plain_ms = lambda b: 60.0 + 7.0 * b
        learnt = run(AutoSwitch(K), engine, batches)
        engine.rng = np.random.default_rng(seed)
        never = run(Never(), engine, batches)
        ratios.append((learnt[1] / learnt[2]) / (never[1] / never[2]))
    assert np.mean(ratios) > 0.97, ratios


@pytest.mark.parametrize("slope, expected_k", [(0.0, K), (0.02, K), (2.0, 0)])
def test_the_choice_follows_the_cost(slope, expected_k):
    engine = Engine(slope=lambda b: slope, noise=0.03)
    assert engine.best_k(8)[0] == expected_k
    ks, _, _ = run(AutoSwitch(K), engine, [8] * 300)
    settled = ks[20:]
    assert np.mean(settled == expected_k) > 0.98  # the rest: explorations of the other choice


def test_cost_that_grows_with_batch_gives_a_threshold():
    """Drafting pays at small batches only: the switch drafts in the tail, not in the bulk."""
    engine = Engine(slope=lambda b: 0.01 * b, alpha=0.7, f=0.9, noise=0.05, seed=3)
    batches = np.repeat(np.arange(128, 0, -1), 12)  # a shrinking batch, as in a rollout
    ks, tokens, ms = run(AutoSwitch(K), engine, batches)
    buckets = np.array([sw.bucket_of(int(b)) for b in batches])
    first_seen = np.unique(buckets, return_index=True)[1]
    cold = np.zeros(len(batches), dtype=bool)  # each new bucket's first 4 steps measure it
    for i in first_seen:
        cold[i : i + 4] = True
    bulk, tail = (batches >= 100) & ~cold, (batches <= 8) & ~cold
    assert engine.best_k(100)[0] == 0 and engine.best_k(8)[0] > 0
    assert np.mean(ks[bulk] == 0) > 0.95, np.bincount(ks[bulk])
    assert np.mean(ks[tail] > 0) > 0.95, np.bincount(ks[tail])


def test_the_switch_recovers_most_of_the_oracles_gain():
    """Tokens per ms against the best fixed k per batch (the oracle) and against never drafting."""
    slope = lambda b: 0.004 * b  # noqa: E731
    batches = np.repeat(np.arange(256, 0, -1), 8)
    make = lambda seed: Engine(slope, alpha=0.8, f=0.9, seed=seed)  # noqa: E731
    learnt = run(AutoSwitch(K), make(5), batches)
    oracle = run(Oracle(make(0)), make(5), batches)
    never = run(Never(), make(5), batches)
    rate = lambda r: r[1] / r[2]  # noqa: E731
    gain_oracle = rate(oracle) / rate(never) - 1
    assert gain_oracle > 0.1  # the setting has something to gain
    assert rate(learnt) / rate(never) - 1 >= 0.9 * gain_oracle


class Oracle:
    def __init__(self, engine):
        self.engine = engine

    def choose_k(self, batch):
        return self.engine.best_k(batch)[0]

    def observe_cost(self, *args):
        pass


class Never(Oracle):
    def __init__(self):
        pass

    def choose_k(self, batch):
        return 0


def test_acceptance_is_followed_when_it_changes():
    """Drafts that stop being accepted stop being sent (the decay follows the batch)."""
    engine = Engine(slope=lambda b: 0.15, alpha=0.8, f=1.0, noise=0.02, seed=7)
    switch = AutoSwitch(K)
    ks, _, _ = run(switch, engine, [4] * 200)
    assert np.mean(ks[20:] == K) > 0.95
    engine.alpha = 0.02  # the text turns unpredictable
    ks, _, _ = run(switch, engine, [4] * 400)
    assert np.mean(ks[-200:] == 0) > 0.97


def test_acceptance_that_rises_while_not_drafting_is_noticed():
    """A greedy batch after a sampled one: the scoring rounds see drafts that would now be accepted,
    although the switch sent none, and it starts drafting within a few rounds."""
    engine = Engine(slope=lambda b: 0.3, alpha=0.05, f=1.0, noise=0.02, seed=11)
    switch = AutoSwitch(K)
    ks, _, _ = run(switch, engine, [4] * 300)
    assert np.mean(ks[20:] == 0) > 0.98
    engine.alpha = 0.9
    ks, _, _ = run(switch, engine, [4] * 200)
    assert engine.best_k(4)[0] == K
    assert np.argmax(ks > 0) < 40, ks[:60]
    assert np.mean(ks[40:] == K) > 0.97


def test_exploration_stays_under_one_percent():
    engine = Engine(slope=lambda b: 3.0, noise=0.05)
    switch = AutoSwitch(K)
    ks, _, _ = run(switch, engine, [32] * 2000)
    assert np.mean(ks[10:] > 0) < 0.01
    report = switch.report()
    (bucket,) = report["buckets"].values()
    assert bucket["k_now"] == 0 and bucket["tries"] >= 10
    assert bucket["cost_per_draft_token"] == pytest.approx(3.0, rel=0.15)
    assert bucket["plain_step_ms"] == pytest.approx(engine.plain_ms(32), rel=0.1)
    assert sum(bucket["steps_by_k"]) == 2000


def test_an_outlier_step_does_not_flip_the_choice():
    engine = Engine(slope=lambda b: 0.05, noise=0.0)
    switch = AutoSwitch(K)
    run(switch, engine, [8] * 50)
    switch.observe_cost(8, engine.f * K, 1e6)  # a pause of the process during a drafted step
    assert switch.choose_k(8) == K


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_k"):
        AutoSwitch(0)


def test_a_wrong_neighbour_cannot_keep_a_bucket_drafting():
    """A warm-up at batch 2 whose timings made drafting look free (a noisy plain step), then the real
    batch at 64, where each draft token costs a full request's worth and drafts are mostly rejected:
    the batch-64 bucket takes its own plain steps, drafts on the borrowed cost at first, learns its
    own cost from those steps and stops."""
    switch = AutoSwitch(K)
    for ms, k in ((120.0, 0), (120.0, 0), (95.0, K), (95.0, K)):  # batch 2: drafted steps look cheaper
        assert switch.choose_k(2) == k
        switch.observe_cost(2, 0.9 * k, ms)
    engine = Engine(slope=lambda b: 1.0, alpha=0.1, f=0.5, noise=0.03, seed=2)
    ks, _, _ = run(switch, engine, [64] * 200)
    assert ks[:2].tolist() == [0, 0]
    assert np.mean(ks[10:] > 0) < 0.02, ks[:40]


def test_a_cost_learnt_from_a_few_noisy_steps_is_confirmed_before_it_rules_drafting_out():
    """The demo's batch 7-9: two drafted steps, learnt while acceptance was low, made drafting look 2.5x
    dearer than it is (s 0.6 against 0.25). Once acceptance is high, drafting would pay at half that
    cost, so the bucket takes a few more full steps, learns the true cost and drafts."""
    switch = AutoSwitch(K)
    for ms, d in ((100.0, 0.0), (100.0, 0.0), (280.0, 3.0), (280.0, 3.0)):  # s = (2.8 - 1) / 3 = 0.6
        switch.observe_cost(8, d, ms)
    hit = np.array([0.0] + [8.0] * K)
    for _ in range(8):  # greedy-like acceptance: 0.6, 0.6, 0.6 per position
        switch.observe_acceptance(8, hit, 0.6 * hit)
    assert sw.best_k_at(switch.accept, 0.0, 0.6, K) == 0 < sw.best_k_at(switch.accept, 0.0, 0.3, K)
    engine = Engine(slope=lambda b: 0.25, alpha=1.0, f=1.0, noise=0.02, seed=3)
    engine.plain_ms = lambda b: 100.0
    ks, _, _ = run(switch, engine, [8] * 40)
    assert ks[0] == K  # not 0: the cost rests on two drafted steps
    assert np.mean(ks[10:] > 0) > 0.9, ks


def test_an_acceptance_estimate_rests_on_enough_rows():
    """At batch 1 a round scores one row: two lucky rows after many rejected ones do not make the
    estimate jump (the half-life stretches to ACCEPT_HALF_LIFE_ROWS rows)."""
    switch = AutoSwitch(K)
    miss, hit = np.zeros(K + 1), np.array([0.0] + [1.0] * K)
    for _ in range(40):
        switch.observe_acceptance(1, hit, miss)
    for _ in range(2):
        switch.observe_acceptance(1, hit, hit)
    assert switch.report()["acceptance_by_position"][0] < 0.2
    for _ in range(40):  # a lasting change is followed
        switch.observe_acceptance(1, hit, hit)
    assert switch.report()["acceptance_by_position"][0] > 0.75


def test_a_round_far_outside_the_estimate_replaces_most_of_it():
    """Greedy after sampled in one engine: first-position acceptance goes from ~0.1 to ~0.6. A round of 8
    rows that far off replaces most of the estimate at once; a round within the noise does not."""
    switch = AutoSwitch(K)

    def round_(rows, accepted_first):
        drafted = np.array([0.0] + [rows] * K)
        switch.observe_acceptance(rows, drafted, np.array([0.0, accepted_first, 0.0, 0.0]))
        return switch.report()["acceptance_by_position"][0]

    for _ in range(30):
        estimate = round_(32, 3.0)  # ~0.1
    assert estimate == pytest.approx(3 / 32, abs=1e-3)
    assert round_(32, 6.0) < 0.12  # 0.19 in one round of 32: within 3.5 standard errors
    assert round_(8, 5.0) > 0.5  # 5 of 8 against ~0.1: a new regime
    assert round_(8, 5.0) > 0.55  # and moves on towards 0.625 at the usual pace


def test_the_report_keeps_run_totals_beside_the_decayed_estimate():
    switch = AutoSwitch(K)
    hit, miss = np.array([0.0] + [4.0] * K), np.zeros(K + 1)
    switch.observe_acceptance(4, hit, hit)
    switch.observe_acceptance(4, hit, miss)
    report = switch.report()
    assert report["scored_rows"] == 8
    assert report["run_acceptance_by_position"] == [0.5, 0.5, 0.5]
    assert report["acceptance_by_position"][0] < 0.5  # decayed: the later round weighs more


def test_a_cost_learnt_at_one_draft_token_does_not_rule_out_full_drafts():
    """The demo's greedy batch after its sampled ones: at batch 5 the sampled rounds confirmed s = 0.64 from
    one-token measuring steps, but a drafted step there pays a fixed 46% of a plain step and 13% a token,
    so three tokens cost 0.29 each. Once acceptance is greedy-high, full drafts would pay at half 0.64: the
    bucket measures larger drafts (its cost was never confirmed at drafts that large), which tell the fixed
    part from the per-token one, and drafts in full."""
    switch = AutoSwitch(K)
    fixed, per_token = 0.46, 0.13
    for _ in range(2):
        switch.observe_cost(5, 0.0, 100.0)
    for _ in range(8):  # one-token drafts in 90% of rows: s = (0.46 + 0.13 * 0.9) / 0.9 = 0.64
        switch.observe_cost(5, 0.9, 100.0 * (1 + fixed + per_token * 0.9))
    hit = np.array([0.0] + [5.0] * K)
    for _ in range(8):  # greedy-like acceptance
        switch.observe_acceptance(5, hit, np.array([0.0, 2.75, 2.25, 1.8]))
    learnt = sw.cost_line(switch.cost, sw.bucket_of(5))
    assert learnt == pytest.approx((0.0, 0.64), abs=0.01)  # one size of drafts: all of it per token
    assert sw.best_k_at(switch.accept, *learnt, K) == 0
    ks = []
    for _ in range(30):
        k = switch.choose_k(5)
        d = 0.95 * k
        switch.observe_cost(5, d, 100.0 * (1 + (fixed + per_token * d if k else 0.0)))
        ks.append(k)
    assert ks[0] > 0, ks  # a measuring step: the one-token cost is not confirmed for larger drafts
    assert sw.cost_line(switch.cost, sw.bucket_of(5)) == pytest.approx((fixed, per_token), abs=0.02)
    assert np.mean(np.array(ks[5:]) == K) > 0.9, ks


def test_a_new_batch_of_requests_replaces_most_of_the_acceptance_estimate():
    """Greedy requests after sampled ones: at batch 8 their first round (0.55 against ~0.18) is not far
    enough off to count as a jump, but the eight requests started since the last round already say that a
    new batch began, so its first rounds decide; a trickle of fewer than JUMP_ROWS starts does not."""
    switch = AutoSwitch(K)
    drafted = np.array([0.0] + [8.0] * K)
    for _ in range(30):
        switch.observe_acceptance(8, drafted, np.array([0.0, 1.44, 0.5, 0.2]))  # ~0.18
    before = switch.report()["acceptance_by_position"][0]
    switch.observe_new_requests(sw.JUMP_ROWS - 1, 16)
    assert switch.report()["acceptance_by_position"][0] == pytest.approx(before)
    assert not sw.acceptance_jumped(switch.accept, 8, 4.4)  # 0.55 alone would be followed slowly
    switch.observe_new_requests(8, 8)
    switch.observe_acceptance(8, drafted, np.array([0.0, 4.4, 3.0, 2.0]))
    assert switch.report()["acceptance_by_position"][0] > 0.45


def test_a_small_new_batch_replaces_the_estimate_only_when_every_request_is_new():
    """The engine benchmark's greedy part: 4 greedy requests after 64 sampled ones. Its rounds score 4 rows,
    too few to show a jump, so the estimate turns over only because all 4 requests are new; 2 new requests
    beside 2 older ones (continuous batching) leave it as it is."""
    drafted = np.array([0.0] + [4.0] * K)
    switches = AutoSwitch(K), AutoSwitch(K)
    for switch in switches:
        for _ in range(30):
            switch.observe_acceptance(16, 4 * drafted, np.array([0.0, 2.88, 1.0, 0.4]))  # ~0.18
    trickle, new_batch = switches
    trickle.observe_new_requests(2, 4)
    new_batch.observe_new_requests(4, 4)
    for switch in switches:
        switch.observe_acceptance(4, drafted, np.array([0.0, 2.2, 1.5, 1.0]))  # 0.55
    assert trickle.report()["acceptance_by_position"][0] < 0.25
    assert new_batch.report()["acceptance_by_position"][0] > 0.4


def test_a_smaller_batchs_cost_is_a_lower_bound():
    """The engine benchmark's sampled batch of 64 after a warm-up that confirmed cheap drafts at batch 2:
    that cost is a lower bound at 64 requests, so the first drafted steps there take the k a middling cost
    would (one token at sampled acceptance), not full drafts that cost four plain steps on a CPU. And where
    no k pays even at a confirmed smaller batch's cost, a larger bucket takes no measuring steps."""
    sampled = np.array([0.0, 0.15, 0.03, 0.005])
    hit = np.array([0.0] + [8.0] * K)

    switch = AutoSwitch(K)
    for _ in range(2):
        switch.observe_cost(2, 0.0, 100.0)
    for _ in range(8):
        switch.observe_cost(2, 3.0, 100.0)  # free drafts (a noisy warm-up)
    for _ in range(8):
        switch.observe_acceptance(8, hit, 8.0 * sampled)
    assert sw.best_k_at(switch.accept, 0.0, 0.0, K) == K
    ks = [switch.choose_k(64) for _ in range(3)]  # no drafted step observed: each asks again
    for _ in range(2):
        switch.observe_cost(64, 0.0, 300.0)
    assert sw.best_k_at(switch.accept, 0.0, sw.PROBE_SLOPE, K) == 0  # a middling cost: none pays
    assert ks[:2] == [0, 0] and switch.choose_k(64) == 1  # the least a measuring step drafts

    switch = AutoSwitch(K)
    for _ in range(2):
        switch.observe_cost(8, 0.0, 100.0)
    for _ in range(8):  # confirmed at full drafts: 0.6 a token
        switch.observe_cost(8, 3.0, 100.0 * (1 + 0.6 * 3.0))
    for _ in range(8):  # greedy-like acceptance: pays at 0.3 a token, not at 0.6
        switch.observe_acceptance(8, hit, 0.6 * hit)
    assert sw.best_k_at(switch.accept, 0.0, 0.6, K) == 0 < sw.best_k_at(switch.accept, 0.0, 0.3, K)
    for _ in range(2):
        switch.observe_cost(16, 0.0, 150.0)
    assert [switch.choose_k(16) for _ in range(20)] == [0] * 20
    for _ in range(2):
        switch.observe_cost(4, 0.0, 80.0)
    assert switch.choose_k(4) > 0  # a larger batch's cost is an upper bound below it: half of it may pay
