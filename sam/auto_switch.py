"""The online switch (``schedule: "auto"``): learn what drafting costs and earns, choose k per step.

An engine step that schedules ``B`` requests and verifies ``d`` draft tokens per request on average
takes about ``T0(B) * (1 + s(B) * d)`` milliseconds: ``T0`` is the plain step, ``s`` the relative cost
of one draft token per request (near 0 on a memory-bound GPU at small batch, 0.1-0.5 on a CPU).
Asking for k drafts emits ``1 + a_1 + ... + a_k`` tokens per request, where ``a_j`` is the share of
requests whose j-th draft token is accepted, and verifies ``f_1 + ... + f_k`` draft tokens per request
(``f_j``: the share that gets a j-th draft token). Each step takes the k in 0..K with the most tokens
per second, and 0 unless that gains ``MARGIN``.

What is learnt, from the steps themselves (clean steps only: no request started, none mid-prefill):
- per batch-size bucket (half powers of two), the mean time of plain steps and of drafted steps with
  their mean draft tokens per request, which give ``s = (drafted / plain - 1) / d``;
- per draft position, ``a_j`` and ``f_j``, from scoring rounds: every ``max_k + 1`` steps the stepper
  takes a full (K-token) draft for every decode row, whether or not it sends it, and scores it against
  the tokens the engine emits next. That is unbiased whatever k is chosen: a verified draft token is
  accepted with the target's probability of it, which is the chance that the emitted token equals it
  (rejection sampling is lossless). So acceptance is learnt also while the switch is not drafting, and
  a rise in it (a greedy batch after a sampled one, a repetitive stretch) is seen within a few rounds.
  Rounds are decayed per round, so that ``a_j`` follows the batch along its responses, and more slowly
  where a round scores few rows (the tail), so that the estimate rests on enough of them; a round far
  outside the estimate (a new batch in another regime, as greedy after sampled) replaces most of it.
A bucket that has not learnt its own s yet takes two plain steps, then borrows the nearest bucket's s when
the answer is clear (drafting pays at that cost, or would not pay at half of it); otherwise it measures
itself with two drafted steps. A bucket that drafts on a borrowed s learns its own from those steps, so
a wrong neighbour (a noisy warm-up, another batch regime) cannot keep it drafting; one whose own s rests
on few drafted steps takes more of them where the choice hinges on it (drafting would pay at half that
s), so a few noisy steps cannot keep it from drafting for good. These measuring steps draft the k that
would pay at the lower cost in question (half the neighbour's or its own s; ``PROBE_SLOPE`` when nothing
is known): at sampled acceptance that is one token, not K, so a measuring step costs about a third as
much where drafts are dear (a CPU), which is what a batch that passes through a bucket in a few steps
can afford. Every bucket tries
the other choice once every ``EXPLORE_EVERY`` of its steps (plain while it drafts, K while it does not),
so that it sees a drift in cost: under 1% of steps.

All state is plain float64 arrays updated by compiled functions (the rollout simulator runs the same
functions); :class:`AutoSwitch` holds them for an engine. vLLM uses the driver rank's drafts only
(docs/vllm-hooks.md), so the driver's decisions are the ones that count.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

NUM_BUCKETS = 24  # half powers of two: batch 1 .. ~4096
MARGIN = 0.02  # a k > 0 must promise >= 2% more tokens per second than no drafts
EXPLORE_EVERY = 128  # steps of a bucket between two tries of the choice it is not making
STEP_DECAY = 0.5 ** (1 / 16)  # per observation of that kind (plain or drafted) in the bucket
MIN_WEIGHT = 1.0 + STEP_DECAY  # two observations before an estimate is used
# acceptance estimates: a half-life of ACCEPT_HALF_LIFE_ROUNDS scoring rounds (16 steps at K = 3), longer
# where rounds score few rows, so that an estimate never rests on fewer than ~ACCEPT_HALF_LIFE_ROWS rows
ACCEPT_HALF_LIFE_ROUNDS = 4.0
ACCEPT_HALF_LIFE_ROWS = 16.0
# a round of >= JUMP_ROWS rows whose first-position acceptance is JUMP_Z standard errors off the estimate
# (a new batch in another regime: greedy after sampled) keeps older evidence worth JUMP_KEEP of its rows
JUMP_ROWS = 8
JUMP_Z = 3.5
JUMP_KEEP = 0.25
MIN_DRAFTS_PER_REQUEST = 0.25  # a drafted step below this says little about s
OUTLIER = 1.5  # an observation above OUTLIER x the mean (a pause of the process) counts as that
PROBE_SLOPE = 0.25  # a middling cost (CPU 0.1-0.6, GPU at small batch ~0): the k of a first measurement
CONFIRM_WEIGHT = 6.0  # a bucket's s from fewer drafted steps is confirmed before it alone rules drafting out

# cost[bucket, field]: exponentially weighted means and their weights
PLAIN_MS, PLAIN_W, DRAFTED_MS, DRAFTED_D, DRAFTED_W, SINCE_TRY, TRIES = range(7)
COST_FIELDS = 7
# accept[position j, field] (row 0 unused)
ASKED, DRAFTED, ACCEPTED = range(3)
ACCEPT_FIELDS = 3


@njit(cache=True)
def scoring_round_every(max_k):
    """Steps between two scoring rounds: a round's drafts are decided within max_k plain steps."""
    return max_k + 1


@njit(cache=True)
def bucket_of(batch):
    """0 for batch 1; then one bucket per half power of two."""
    if batch <= 1:
        return 0
    return min(int(math.floor(2.0 * math.log2(batch) + 0.5)), NUM_BUCKETS - 1)


@njit(cache=True)
def slope(cost, bucket):
    """s of a bucket from its plain and drafted means; -1.0 while either is unknown."""
    c = cost[bucket]
    if c[PLAIN_W] < MIN_WEIGHT or c[DRAFTED_W] < MIN_WEIGHT or c[DRAFTED_D] <= 0.0:
        return -1.0
    return max((c[DRAFTED_MS] / c[PLAIN_MS] - 1.0) / c[DRAFTED_D], 0.0)


@njit(cache=True)
def nearest_slope(cost, bucket):
    """s of the nearest bucket that knows its own; -1.0 when none does."""
    for dist in range(1, NUM_BUCKETS):
        for b in (bucket - dist, bucket + dist):
            if 0 <= b < NUM_BUCKETS:
                s = slope(cost, b)
                if s >= 0.0:
                    return s
    return -1.0


@njit(cache=True)
def expected_per_request(accept, k):
    """(tokens emitted, draft tokens verified) per request when asking for k drafts; positions without
    evidence count as fully drafted and accepted (optimistic: drafting is how they are learnt)."""
    tokens, drafts = 1.0, 0.0
    for j in range(1, k + 1):
        asked = accept[j, ASKED]
        if asked < 0.5:
            tokens += 1.0
            drafts += 1.0
        else:
            tokens += accept[j, ACCEPTED] / asked
            drafts += accept[j, DRAFTED] / asked
    return tokens, drafts


@njit(cache=True)
def best_k_at(accept, s, max_k):
    """The k with the most expected tokens per second at relative cost s per draft token (0 below MARGIN)."""
    k_best, gain_best = 0, 1.0
    for k in range(1, max_k + 1):
        tokens, drafts = expected_per_request(accept, k)
        gain = tokens / (1.0 + s * drafts)
        if gain > gain_best:
            k_best, gain_best = k, gain
    return k_best if gain_best >= 1.0 + MARGIN else 0


@njit(cache=True)
def best_k(cost, accept, bucket, max_k):
    """What a bucket would choose now, before any try of the other choice.

    With its own s: the best k at that cost; but while s rests on fewer than CONFIRM_WEIGHT drafted
    steps and drafting would pay at half of it, drafted steps at the k that half would take, which
    refine s (a few noisy steps must not keep a bucket from drafting for good). Without: plain steps
    first; then the nearest bucket's s decides when it is clear (drafting pays at the neighbour's cost,
    or would not pay even at half of it), and a bucket that drafts on that learns its own s from those
    steps; otherwise the bucket measures itself at the k half the neighbour's s would take, or, with
    nothing learnt anywhere, at the k PROBE_SLOPE would take (at least one token)."""
    s = slope(cost, bucket)
    if s >= 0.0:
        k = best_k_at(accept, s, max_k)
        if k == 0 and cost[bucket, DRAFTED_W] < CONFIRM_WEIGHT:
            return best_k_at(accept, 0.5 * s, max_k)  # > 0: drafting would pay at half that cost
        return k
    if cost[bucket, PLAIN_W] < MIN_WEIGHT:
        return 0  # plain steps first: cheap to take, and without them the bucket never learns its own s
    near = nearest_slope(cost, bucket)
    if near >= 0.0:
        k = best_k_at(accept, near, max_k)
        if k > 0:
            return k
        return best_k_at(accept, 0.5 * near, max_k)  # 0 when drafting would not pay even at half
    return max(best_k_at(accept, PROBE_SLOPE, max_k), 1)


@njit(cache=True)
def choose_k(cost, accept, batch, max_k):
    """Draft tokens per request for a step scheduling ``batch`` requests."""
    b = bucket_of(batch)
    k = best_k(cost, accept, b, max_k)
    c = cost[b]
    c[SINCE_TRY] += 1.0
    if c[SINCE_TRY] >= EXPLORE_EVERY:
        c[SINCE_TRY] = 0.0
        c[TRIES] += 1.0
        return max_k if k == 0 else 0
    return k


@njit(cache=True)
def _blend(cost, bucket, mean_field, weight_field, value):
    c = cost[bucket]
    if c[weight_field] >= MIN_WEIGHT:
        value = min(value, OUTLIER * c[mean_field])
    w = c[weight_field] * STEP_DECAY
    c[mean_field] = (c[mean_field] * w + value) / (w + 1.0)
    c[weight_field] = w + 1.0
    return w


@njit(cache=True)
def observe_cost(cost, batch, drafts_per_request, step_ms):
    """A clean step: its batch, the draft tokens it verified per request, its time."""
    b = bucket_of(batch)
    if drafts_per_request <= 0.0:
        _blend(cost, b, PLAIN_MS, PLAIN_W, step_ms)
    elif drafts_per_request >= MIN_DRAFTS_PER_REQUEST:
        w = _blend(cost, b, DRAFTED_MS, DRAFTED_W, step_ms)
        c = cost[b]
        c[DRAFTED_D] = (c[DRAFTED_D] * w + drafts_per_request) / (w + 1.0)


@njit(cache=True)
def acceptance_jumped(accept, rows, accepted_first):
    """Whether a round's first-position acceptance is far outside what the estimate predicts (a binomial
    standard error, its variance floored so that an estimate near 0 or 1 still allows some noise)."""
    if rows < JUMP_ROWS or accept[1, ASKED] < rows:
        return False
    p = accept[1, ACCEPTED] / accept[1, ASKED]
    se = math.sqrt(max(p * (1.0 - p), 0.05) / rows)
    return abs(accepted_first / rows - p) > JUMP_Z * se


@njit(cache=True)
def observe_acceptance(accept, rows, drafted_at, accepted_at):
    """One scoring round: ``rows`` full drafts scored; ``drafted_at[j]`` of them had a j-th draft token
    and ``accepted_at[j]`` matched the emitted tokens up to it (j = 1..max_k)."""
    if rows <= 0:
        return
    decay = 0.5 ** (1.0 / max(ACCEPT_HALF_LIFE_ROUNDS, ACCEPT_HALF_LIFE_ROWS / rows))
    if acceptance_jumped(accept, rows, accepted_at[1]):
        decay = min(decay, JUMP_KEEP * rows / accept[1, ASKED])
    for j in range(1, accept.shape[0]):
        accept[j, ASKED] = accept[j, ASKED] * decay + rows
        accept[j, DRAFTED] = accept[j, DRAFTED] * decay + drafted_at[j]
        accept[j, ACCEPTED] = accept[j, ACCEPTED] * decay + accepted_at[j]


class AutoSwitch:
    """The online switch's state for one engine, and what it reports."""

    learns_acceptance = True  # the stepper runs scoring rounds for it

    def __init__(self, max_k: int):
        if max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {max_k}")
        self.max_k = max_k
        self.score_every = int(scoring_round_every(max_k))
        self.cost = np.zeros((NUM_BUCKETS, COST_FIELDS))
        self.accept = np.zeros((max_k + 1, ACCEPT_FIELDS))
        self.chosen = np.zeros((NUM_BUCKETS, max_k + 1), dtype=np.int64)  # steps per (bucket, k)
        self.scored_rows = 0  # over the whole run, undecayed: what the report's run totals rest on
        self.scored_accepted = np.zeros(max_k + 1)

    def choose_k(self, batch: int) -> int:
        k = int(choose_k(self.cost, self.accept, int(batch), self.max_k))
        self.chosen[bucket_of(int(batch)), k] += 1
        return k

    def observe_cost(self, batch: int, drafts_per_request: float, step_ms: float) -> None:
        observe_cost(self.cost, int(batch), float(drafts_per_request), float(step_ms))

    def observe_acceptance(self, rows: int, drafted_at: np.ndarray, accepted_at: np.ndarray) -> None:
        observe_acceptance(self.accept, int(rows), drafted_at, accepted_at)
        self.scored_rows += int(rows)
        self.scored_accepted += accepted_at

    def report(self) -> dict:
        """Per bucket that saw steps: its batch range, the k chosen and how often, the learnt costs, and why."""
        buckets = {}
        for b in np.flatnonzero(self.chosen.sum(axis=1)):
            lo, hi = bucket_range(int(b))
            c = self.cost[b]
            s = float(slope(self.cost, int(b)))
            gains = None
            if s >= 0.0:
                gains = []
                for k in range(self.max_k + 1):
                    tokens, drafts = expected_per_request(self.accept, k)
                    gains.append(round(float(tokens / (1.0 + s * drafts)), 4))
            buckets[f"{lo}-{hi}"] = {
                "steps_by_k": self.chosen[b].tolist(),
                "k_now": int(best_k(self.cost, self.accept, int(b), self.max_k)),
                "plain_step_ms": round(float(c[PLAIN_MS]), 3) if c[PLAIN_W] > 0 else None,
                "drafted_step_ms": round(float(c[DRAFTED_MS]), 3) if c[DRAFTED_W] > 0 else None,
                "drafts_per_request": round(float(c[DRAFTED_D]), 3) if c[DRAFTED_W] > 0 else None,
                "cost_per_draft_token": round(s, 4) if s >= 0 else None,
                "expected_gain_by_k": gains,
                "tries": int(c[TRIES]),
            }
        accept = []
        for j in range(1, self.max_k + 1):
            asked = self.accept[j, ASKED]
            accept.append(round(float(self.accept[j, ACCEPTED] / asked), 4) if asked > 0 else None)
        run = self.scored_accepted[1:] / self.scored_rows if self.scored_rows else np.zeros(self.max_k)
        return {
            "acceptance_by_position": accept,  # the decayed estimate the switch decides on now
            "scored_rows": self.scored_rows,
            "run_acceptance_by_position": [round(float(a), 4) for a in run],  # over every scored row
            "buckets": buckets,
        }


def bucket_range(bucket: int) -> tuple[int, int]:
    """The batch sizes (lo, hi) that fall in a bucket."""
    sizes = [b for b in range(1, 1 << 13) if bucket_of(b) == bucket]
    return (sizes[0], sizes[-1]) if sizes else (0, 0)
