"""The step-cost model behind the rollout simulator: acceptance for k drafts, the k that pays per step
and per batch size, and the distinct experts an MoE layer reads.

A schedule (``sam_rollout.drafter.switch``) can be derived from a step-cost model ``T(batch, q, context)``
(milliseconds for one step verifying ``q`` tokens per request) and an acceptance model (expected tokens
emitted per step with ``k`` drafts): drafting ``k`` tokens pays when the tokens gained outweigh the
longer step (``derive_schedule``).

Acceptance for fewer drafts than measured uses a geometric model: a measured profile gives, per
position bin, the mean tokens per step (bonus included) and mean drafted tokens with K drafts.
Drafts are taken as either absent or full length (fraction ``f = drafted / K`` of steps draft), and
draft token j is accepted with probability ``alpha**j`` (each accepted given the previous one was,
with the same rate). Then ``tokens(k) = 1 + f * (alpha + ... + alpha**k)``; for k = K this
reproduces the measurement exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
from numba import njit

from sam_rollout.drafter.switch import Schedule, k_for_batch

StepCost = Callable[[int, float, float], float]  # (batch, tokens per request q, context) -> ms


# --------------------------------------------------------------------------------------------
# Schedules as arrays
# --------------------------------------------------------------------------------------------


def schedule_from_k_by_batch(k_by_batch: Sequence[int]) -> Schedule:
    """Compress ``k_by_batch[b - 1]`` (k for batch b = 1..len) into pairs; trailing zeros dropped."""
    ks = [int(k) for k in k_by_batch]
    while ks and ks[-1] == 0:
        ks.pop()
    if not ks:
        return ((1, 0),)
    out = []
    for b, k in enumerate(ks, start=1):
        if out and out[-1][1] == k:
            out[-1] = (b, k)
        else:
            out.append((b, k))
    return tuple(out)


def k_by_batch_array(schedule: Schedule, max_batch: int) -> np.ndarray:
    """``arr[b]`` = k for batch b (index 0 unused, 0)."""
    arr = np.zeros(max_batch + 1, dtype=np.int64)
    for b in range(1, max_batch + 1):
        arr[b] = k_for_batch(schedule, b)
    return arr


# --------------------------------------------------------------------------------------------
# Acceptance for k drafts (geometric model from one measured K)
# --------------------------------------------------------------------------------------------


def _geometric_sum(alpha: float, k: int) -> float:
    return float(sum(alpha**j for j in range(1, k + 1)))


def fit_acceptance_rate(tokens_per_step: float, drafted_per_step: float, k: int) -> tuple[float, float]:
    """(fraction of steps that draft f, per-token acceptance alpha) reproducing one measurement.

    ``tokens_per_step`` includes the bonus token; ``drafted_per_step`` is the mean number of draft
    tokens per step, with ``k`` drafts at most.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 1.0 <= tokens_per_step <= 1.0 + k + 1e-9:
        raise ValueError(f"tokens_per_step must lie in [1, {1 + k}], got {tokens_per_step}")
    if not 0.0 <= drafted_per_step <= k + 1e-9:
        raise ValueError(f"drafted_per_step must lie in [0, {k}], got {drafted_per_step}")
    gained = tokens_per_step - 1.0
    if gained > drafted_per_step + 1e-9:
        raise ValueError(f"more accepted ({gained}) than drafted ({drafted_per_step}) tokens per step")
    f = drafted_per_step / k
    if f <= 0.0 or gained <= 0.0:
        return f, 0.0
    target = min(gained / f, float(k))
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: the geometric sum increases with alpha
        mid = 0.5 * (lo + hi)
        if _geometric_sum(mid, k) < target:
            lo = mid
        else:
            hi = mid
    return f, 0.5 * (lo + hi)


def tokens_per_step_for_k(f: float, alpha: float, k: int) -> float:
    return 1.0 + f * _geometric_sum(alpha, k)


def acceptance_by_k(tokens_per_step: float, drafted_per_step: float, measured_k: int, max_k: int | None = None):
    """Arrays ``tokens[k]`` and ``drafted[k]`` for k = 0..max_k from one K-draft measurement."""
    max_k = measured_k if max_k is None else max_k
    f, alpha = fit_acceptance_rate(tokens_per_step, drafted_per_step, measured_k)
    tokens = np.array([tokens_per_step_for_k(f, alpha, k) for k in range(max_k + 1)])
    drafted = np.array([f * k for k in range(max_k + 1)])
    return tokens, drafted


# --------------------------------------------------------------------------------------------
# Decisions from the cost model
# --------------------------------------------------------------------------------------------


def choose_k(step_ms_by_k: Sequence[float], min_tokens_by_k: Sequence[float], sum_tokens_by_k: Sequence[float]) -> int:
    """Draft count for one step from its predicted costs and expected tokens.

    ``step_ms_by_k[k]``: predicted step time with k drafts per request (k = 0: plain decode);
    ``min_tokens_by_k[k]``: the smallest expected tokens per step over the step's requests;
    ``sum_tokens_by_k[k]``: their sum. A k is allowed only if *every* request is expected to advance
    at least as fast in wall-clock time as without drafts (min tokens / step time >= 1 / plain step
    time): under the model, no request finishes later, so the rollout cannot get slower. Among the
    allowed k, the one with the highest batch token rate wins; ties go to fewer drafts.
    """
    return int(
        choose_k_arrays(
            np.asarray(step_ms_by_k, dtype=np.float64),
            np.asarray(min_tokens_by_k, dtype=np.float64),
            np.asarray(sum_tokens_by_k, dtype=np.float64),
        )
    )


@njit(cache=True)
def choose_k_arrays(step_ms_by_k, min_tokens_by_k, sum_tokens_by_k):
    """:func:`choose_k` on float64 arrays, compiled (the rollout simulator calls it every step)."""
    t0 = step_ms_by_k[0]
    best_k = 0
    best_rate = sum_tokens_by_k[0] / t0
    for k in range(1, step_ms_by_k.shape[0]):
        tk = step_ms_by_k[k]
        if min_tokens_by_k[k] * t0 < tk:
            continue
        rate = sum_tokens_by_k[k] / tk
        if rate > best_rate * (1.0 + 1e-12):
            best_k = k
            best_rate = rate
    return best_k


def derive_schedule(
    step_cost: StepCost,
    max_batch: int,
    tokens_by_k: Sequence[float],
    drafted_by_k: Sequence[float],
    contexts: Iterable[float],
) -> Schedule:
    """Schedule from the cost model: for each batch size, the k that pays at *every* given context.

    ``tokens_by_k[k]`` / ``drafted_by_k[k]``: expected tokens per step and drafted tokens per request
    (k = 0..K), position-independent; pass a conservative profile (e.g. the lowest well-measured
    bin), since the switch does not know where each request is in its response. A batch size whose
    every request has the same expectation is the case where :func:`choose_k`'s guarantee is exact.
    """
    contexts = [float(c) for c in contexts]
    if not contexts:
        raise ValueError("derive_schedule needs at least one context")
    max_k = len(tokens_by_k) - 1
    k_by_batch = []
    for b in range(1, max_batch + 1):
        best_k, best_gain = 0, 1.0
        for k in range(1, max_k + 1):
            # gain = tokens-per-ms with k drafts over tokens-per-ms without, worst case over contexts
            gain = min(tokens_by_k[k] * step_cost(b, 1.0, c) / step_cost(b, 1.0 + drafted_by_k[k], c) for c in contexts)
            if gain > best_gain * (1.0 + 1e-12):
                best_k, best_gain = k, gain
        k_by_batch.append(best_k)
    return schedule_from_k_by_batch(k_by_batch)


# --------------------------------------------------------------------------------------------
# MoE: distinct experts read in one step
# --------------------------------------------------------------------------------------------


def expected_distinct_experts(
    num_experts: int, top_k: int, requests: float, tokens_per_request: float = 1.0, correlation: float = 0.0
) -> float:
    """Expected number of distinct experts one MoE layer reads in a step.

    Each request's first token routes to ``top_k`` of ``num_experts`` experts uniformly at random,
    independently of other requests. Each of its other ``tokens_per_request - 1`` tokens (the
    drafts being verified) reuses exactly the first token's experts with probability
    ``correlation``, else routes independently. Then an expert stays unread with probability
    ``(1 - p)**requests * (correlation + (1 - correlation) * (1 - p))**(requests * (q - 1))``,
    p = top_k / num_experts. With correlation 0 this is ``E * (1 - (1 - p)**tokens)``.
    Non-integer ``tokens_per_request`` (a batch mean) is allowed.
    """
    if not 0 < top_k <= num_experts:
        raise ValueError(f"need 0 < top_k <= num_experts, got {top_k}, {num_experts}")
    if not 0.0 <= correlation <= 1.0:
        raise ValueError(f"correlation must lie in [0, 1], got {correlation}")
    if requests < 0 or tokens_per_request < 1.0:
        raise ValueError("need requests >= 0 and tokens_per_request >= 1")
    p = top_k / num_experts
    unread = (1.0 - p) ** requests * (correlation + (1.0 - correlation) * (1.0 - p)) ** (
        requests * (tokens_per_request - 1.0)
    )
    return num_experts * (1.0 - unread)
