"""The fixed-weight losslessness check's statistics (evals/two_sample_stats.py): right on known values,
calibrated under the null, and failing on planted biases of the kinds it looks for."""

import math

import numpy as np
import pytest

from evals import two_sample_stats as stats

PROMPTS = 8


def arm(rng, per_prompt, length_shift=0.0, extra_first_token=False) -> stats.ArmSample:
    """Responses shaped like the CPU preset's: 13-15 tokens by prompt, a few long outliers; the first
    token from 3 per-prompt choices (4 with ``extra_first_token``), a later token from 5."""
    p = np.repeat(np.arange(PROMPTS), per_prompt)
    outliers = (rng.random(len(p)) < 0.05) * rng.integers(10, 100, len(p))
    lengths = 13 + p % 3 + rng.poisson(0.3, len(p)) + outliers + length_shift
    first = p * 10 + rng.integers(0, 4 if extra_first_token else 3, len(p))
    later = np.where(lengths > 6, p * 10 + rng.integers(0, 5, len(p)), -1)
    return stats.ArmSample(lengths.tolist(), p.tolist(), first.tolist(), later.tolist())


def test_chi2_tail_and_normal_quantiles_match_tables():
    assert stats.chi2_sf(3.841459, 1) == pytest.approx(0.05, abs=1e-6)
    assert stats.chi2_sf(18.307038, 10) == pytest.approx(0.05, abs=1e-6)
    assert stats.chi2_sf(5.0, 0) == 1.0
    # (1.959964 + 0.841621) x se: the textbook 2.80 at alpha 0.05, power 0.8
    assert stats.min_detectable_shift(1.0, 0.05, 0.8) == pytest.approx(2.801585, abs=1e-5)


def test_mann_whitney_u_matches_counting_pairs():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 6, 40), rng.integers(1, 7, 50)  # many ties
    u = sum((x > y) + 0.5 * (x == y) for x in a for y in b)
    n = len(a) + len(b)
    _, counts = np.unique(np.concatenate([a, b]), return_counts=True)
    sd = math.sqrt(len(a) * len(b) / 12 * ((n + 1) - (counts**3 - counts).sum() / (n * (n - 1))))
    assert stats.mann_whitney(a, b).statistic == pytest.approx((u - len(a) * len(b) / 2) / sd)


def test_stratified_mean_difference_removes_the_prompts_spread():
    a = stats.stratified_mean_difference([10, 12, 100, 102], [0, 0, 1, 1], [11, 13, 101, 103], [0, 0, 1, 1])
    assert a.difference == pytest.approx(-1.0)
    assert a.se == pytest.approx(1.0)  # within-prompt variance 2 per arm: sqrt(2 x (1/4)^2 x (2/2 + 2/2)) = 1
    with pytest.raises(ValueError, match="at least 2"):
        stats.stratified_mean_difference([1, 2, 3], [0, 0, 1], [1, 2, 3], [0, 0, 1])


def test_sparse_cells_are_pooled_not_dropped():
    # one common token and many singletons in each sample: the singletons pool into one cell
    a = [0] * 50 + list(range(1, 21))
    b = [0] * 50 + list(range(21, 41))
    statistic, dof = stats.homogeneity(a, b)
    assert dof == 1 and statistic == pytest.approx(0.0)
    assert stats.homogeneity([0] * 3, [1] * 3) == (0.0, 0)  # too few to test: no degree of freedom


def test_equal_arms_agree_at_the_stated_power():
    rng = np.random.default_rng(0)
    c = stats.compare_arms(arm(rng, 120), arm(rng, 120), power_reps=100)
    assert c["verdict"] == "agree", c
    assert c["min_detectable_shift_80pct"] < stats.AB_LENGTH_SHIFT
    assert c["simulated_power_at_reference_shift"]["mean"] >= 0.8
    assert c["reference_shift_outside_95ci"]


def test_each_test_holds_its_level_under_the_null():
    rng = np.random.default_rng(1)
    reps, alpha = 200, 0.05
    rejections = np.zeros(5)
    for _ in range(reps):
        c = stats.compare_arms(arm(rng, 40), arm(rng, 40), power_reps=0)
        rejections += [t["p_value"] < alpha for t in c["tests"]]
    # binomial(200, 0.05): mean 10, sd 3.1; 20 is 3 sd above
    assert (rejections <= 20).all(), rejections


def test_a_planted_length_shift_is_found():
    rng = np.random.default_rng(2)
    c = stats.compare_arms(arm(rng, 120, length_shift=3.0), arm(rng, 120), power_reps=0)
    assert c["verdict"] == "differ"
    assert "mean length (prompt-stratified z)" in c["rejected"]
    low, high = c["mean_length_difference_95ci"]
    assert low <= 3.0 <= high


def test_a_planted_first_token_bias_is_found():
    rng = np.random.default_rng(4)
    c = stats.compare_arms(arm(rng, 120, extra_first_token=True), arm(rng, 120), power_reps=0)
    assert c["verdict"] == "differ"
    assert c["rejected"] == ["first token (chi-square per prompt)"]


def test_too_few_responses_is_underpowered_not_agree():
    rng = np.random.default_rng(5)
    c = stats.compare_arms(arm(rng, 3), arm(rng, 3), power_reps=0)
    assert c["verdict"] == "underpowered", c


def test_mismatched_fields_are_refused():
    with pytest.raises(ValueError, match="first_tokens"):
        stats.ArmSample([1, 2], [0, 0], [5], [5, 5])
