"""benchmarks.cost_model: schedules as arrays, acceptance for k drafts, cost-model decisions and
derived schedules, MoE expert counts."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cost_model import (
    acceptance_by_k,
    choose_k,
    derive_schedule,
    expected_distinct_experts,
    fit_acceptance_rate,
    k_by_batch_array,
    schedule_from_k_by_batch,
)


def test_schedule_compression_round_trips():
    ks = [3, 3, 3, 2, 2, 0, 1, 0, 0]
    s = schedule_from_k_by_batch(ks)
    assert s == ((3, 3), (5, 2), (6, 0), (7, 1))
    assert list(k_by_batch_array(s, len(ks))[1:]) == ks
    assert schedule_from_k_by_batch([0, 0]) == ((1, 0),)


# ---------------------------------------------------------------------------- acceptance by k


def test_geometric_fit_reproduces_the_measurement_and_orders_k():
    tokens, drafted = acceptance_by_k(2.0, 2.7, measured_k=3)
    assert tokens[3] == pytest.approx(2.0, abs=1e-9)
    assert drafted[3] == pytest.approx(2.7)
    assert tokens[0] == 1.0 and drafted[0] == 0.0
    assert np.all(np.diff(tokens) > 0)  # more drafts, more tokens (never fewer)
    f, a = fit_acceptance_rate(1.0 + 3.0, 3.0, 3)  # everything accepted
    assert f == pytest.approx(1.0) and a == pytest.approx(1.0, abs=1e-9)


def test_geometric_fit_rejects_impossible_measurements():
    with pytest.raises(ValueError):
        fit_acceptance_rate(2.5, 1.0, 3)  # accepted more than drafted
    with pytest.raises(ValueError):
        fit_acceptance_rate(5.5, 3.0, 3)


# ------------------------------------------------------------------------------ decisions


def test_choose_k_requires_every_request_to_gain():
    # step costs 1.0 plain, 1.2 with 3 drafts; the batch gains on average but one request does not
    assert choose_k([1.0, 1.2], [1.1, 1.1], [4.0, 8.0]) == 0
    assert choose_k([1.0, 1.2], [1.3, 1.3], [4.0, 8.0]) == 1
    # free verification, any gain: speculate with the most tokens
    assert choose_k([1.0, 1.0, 1.0], [1.0, 1.5, 1.8], [2.0, 3.0, 3.6]) == 2


def test_derive_schedule_matches_a_hand_checked_cost_model():
    # verification costs (q - 1) * 0.02 * batch of a plain step: k=3 at ~2.2 tokens pays while
    # 2.2 >= 1 + 0.06 b  <=>  b <= 20
    def cost(b, q, c):
        return 10.0 * (1.0 + 0.02 * b * (q - 1.0))

    tokens = [1.0, 1.6, 2.0, 2.2]
    drafted = [0.0, 1.0, 2.0, 3.0]
    s = derive_schedule(cost, 64, tokens, drafted, contexts=[2048])
    arr = k_by_batch_array(s, 64)
    assert arr[1] == 3 and arr[64] == 0
    # by hand: gain(k) = tokens[k] / (1 + 0.02 b k); best k per batch
    for b in range(1, 65):
        gains = [tokens[k] / (1 + 0.02 * b * k) for k in range(4)]
        assert arr[b] == int(np.argmax(gains)), b


def test_derive_schedule_is_off_when_verification_is_dear():
    s = derive_schedule(lambda b, q, c: q, 16, [1.0, 1.5, 1.9, 2.2], [0, 1, 2, 3], contexts=[1])
    assert s == ((1, 0),)


# ------------------------------------------------------------------------------------ MoE


def test_distinct_experts_published_examples():
    assert expected_distinct_experts(128, 8, 1, 1) == pytest.approx(8.0)
    assert expected_distinct_experts(128, 8, 1, 4) == pytest.approx(29.1, abs=0.05)
    assert expected_distinct_experts(128, 8, 8, 1) == pytest.approx(51.6, abs=0.05)
    assert expected_distinct_experts(128, 8, 8, 4) == pytest.approx(111.8, abs=0.05)
    # full correlation: drafts reuse their request's experts, no extra reads
    assert expected_distinct_experts(128, 8, 8, 4, correlation=1.0) == pytest.approx(
        expected_distinct_experts(128, 8, 8, 1)
    )


def _monte_carlo_distinct(E, top, B, q, rho, trials, rng):
    out = np.empty(trials)
    for t in range(trials):
        used = np.zeros(E, dtype=bool)
        for _ in range(B):
            first = rng.choice(E, size=top, replace=False)
            used[first] = True
            for _ in range(q - 1):
                used[first if rng.random() < rho else rng.choice(E, size=top, replace=False)] = True
        out[t] = used.sum()
    return out


@pytest.mark.parametrize("B, q, rho", [(1, 4, 0.0), (8, 1, 0.0), (8, 4, 0.0), (4, 4, 0.5), (16, 2, 0.8)])
def test_distinct_experts_formula_against_monte_carlo(B, q, rho):
    rng = np.random.default_rng(1234 + B * 10 + q)
    mc = _monte_carlo_distinct(128, 8, B, q, rho, 4000, rng)
    sem = mc.std(ddof=1) / np.sqrt(len(mc))
    assert abs(mc.mean() - expected_distinct_experts(128, 8, B, q, rho)) < 5 * sem + 1e-9
