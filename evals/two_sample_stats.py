"""Two-sample tests for "SAM on and off sample the same distribution", stratified by prompt.

Both arms hold the same prompts with the same number of responses each, so pooling over prompts
compares the same mixture in both arms and every pooled test below is valid; the stratified ones
(per-prompt mean difference, per-prompt chi-square summed) also remove the between-prompt spread.

- **Mean length**: the difference of the per-prompt mean lengths, averaged with each prompt's share
  of the responses; its standard error from the within-prompt variances; a two-sided z test and a
  95% interval. Power: the smallest shift this test detects with probability ``POWER`` at the level
  it is tested at, by the normal approximation ``(z_{1-a/2} + z_power) x se``.
- **Length distribution**: Mann-Whitney U (tie-corrected normal approximation), and a chi-square on
  lengths binned at the pooled sample's deciles, per prompt, summed over prompts.
- **Token distributions** (the first response token; the token at a later position among responses
  that reach it): chi-square of homogeneity per prompt, summed over prompts. Within a prompt, cells
  whose expected count is below ``MIN_EXPECTED`` in either arm are pooled into one.
- The family of tests is held at ``ALPHA`` by Bonferroni; the verdict is "differ" if any test
  rejects, "agree" if none does and the mean-length test has power ``POWER`` at the reference shift
  (the two-replica A/B's +3.6 tokens), otherwise "underpowered".

numpy and torch only (torch for the chi-square tail: the regularised incomplete gamma).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

ALPHA = 0.05  # family-wise
POWER = 0.8
AB_LENGTH_SHIFT = 3.6  # tokens: the two-replica A/B's response-length difference (SAM - baseline)
MIN_EXPECTED = 5.0
LENGTH_BINS = 10
NORMAL = NormalDist()


@dataclass(frozen=True)
class ArmSample:
    """One arm's responses: per response, its length, its prompt, its first token and its token at
    the later position (-1 where the response is shorter)."""

    lengths: Sequence[int]
    prompt_index: Sequence[int]
    first_tokens: Sequence[int]
    later_tokens: Sequence[int]

    def __post_init__(self) -> None:
        n = len(self.lengths)
        for name in ("prompt_index", "first_tokens", "later_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"ArmSample.{name} has {len(getattr(self, name))} entries, lengths has {n}")
        if n == 0:
            raise ValueError("ArmSample has no responses")


@dataclass(frozen=True)
class TestResult:
    name: str
    statistic: float
    p_value: float
    dof: int | None = None  # chi-square tests

    def as_dict(self) -> dict:
        d = {"name": self.name, "statistic": round(self.statistic, 4), "p_value": float(f"{self.p_value:.4g}")}
        if self.dof is not None:
            d["dof"] = self.dof
        return d


def chi2_sf(statistic: float, dof: int) -> float:
    """P(chi-square with ``dof`` degrees of freedom > statistic); 1.0 with no degree of freedom."""
    if dof <= 0:
        return 1.0
    import torch

    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))  # fmt: skip


def two_sided_p(z: float) -> float:
    return 2.0 * NORMAL.cdf(-abs(z))


# ---------------------------------------------------------------------------------------------
# Lengths
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeanDifference:
    difference: float  # a - b, prompt-stratified
    se: float

    def z_test(self) -> TestResult:
        z = self.difference / self.se if self.se > 0 else (0.0 if self.difference == 0 else math.inf)
        return TestResult("mean length (prompt-stratified z)", z, two_sided_p(z))

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        half = NORMAL.inv_cdf(0.5 + level / 2) * self.se
        return self.difference - half, self.difference + half


def stratified_mean_difference(a, strata_a, b, strata_b) -> MeanDifference:
    """Difference of per-stratum means, weighted by the stratum's share of both samples; its standard
    error from the within-stratum variances. Every stratum needs at least 2 values in each sample."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    strata_a, strata_b = np.asarray(strata_a), np.asarray(strata_b)
    keys = np.union1d(strata_a, strata_b)
    total = len(a) + len(b)
    diff, var = 0.0, 0.0
    for key in keys:
        xa, xb = a[strata_a == key], b[strata_b == key]
        if len(xa) < 2 or len(xb) < 2:
            raise ValueError(f"stratum {key!r} has {len(xa)} and {len(xb)} values: at least 2 each are needed")
        w = (len(xa) + len(xb)) / total
        diff += w * (xa.mean() - xb.mean())
        var += w * w * (xa.var(ddof=1) / len(xa) + xb.var(ddof=1) / len(xb))
    return MeanDifference(float(diff), math.sqrt(var))


def mann_whitney(a, b) -> TestResult:
    """Two-sided Mann-Whitney U, normal approximation with the tie correction."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n1, n2 = len(a), len(b)
    pooled = np.concatenate([a, b])
    _, inverse, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    mid_ranks = ends - (counts - 1) / 2.0  # average rank of each tied value
    u = mid_ranks[inverse[:n1]].sum() - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    tie = (counts**3 - counts).sum() / (n * (n - 1))
    sd = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie))
    if sd == 0:
        return TestResult("lengths (Mann-Whitney U)", 0.0, 1.0)
    z = (u - n1 * n2 / 2.0) / sd
    return TestResult("lengths (Mann-Whitney U, z)", float(z), two_sided_p(z))


def length_bins(a, b, bins: int = LENGTH_BINS) -> tuple[np.ndarray, np.ndarray]:
    """Bin labels of both samples at the pooled sample's quantiles (ties may merge bins)."""
    pooled = np.concatenate([np.asarray(a), np.asarray(b)]).astype(np.float64)
    edges = np.unique(np.quantile(pooled, np.linspace(0, 1, bins + 1)[1:-1]))
    return np.searchsorted(edges, a, side="right"), np.searchsorted(edges, b, side="right")


# ---------------------------------------------------------------------------------------------
# Categories (tokens, length bins)
# ---------------------------------------------------------------------------------------------


def homogeneity(labels_a, labels_b) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of a 2 x K table of two samples' labels; cells
    expected below MIN_EXPECTED in either sample pooled into one (and that cell into the smallest
    other cell if it is still too small)."""
    labels_a, labels_b = np.asarray(labels_a), np.asarray(labels_b)
    if len(labels_a) == 0 or len(labels_b) == 0:
        return 0.0, 0
    keys, inverse = np.unique(np.concatenate([labels_a, labels_b]), return_inverse=True)
    table = np.zeros((2, len(keys)))
    np.add.at(table[0], inverse[: len(labels_a)], 1)
    np.add.at(table[1], inverse[len(labels_a) :], 1)
    rows = table.sum(axis=1, keepdims=True)
    share = rows / rows.sum()
    small = (share * table.sum(axis=0)).min(axis=0) < MIN_EXPECTED
    if small.any():
        table = np.column_stack([table[:, ~small], table[:, small].sum(axis=1)])
        while table.shape[1] > 1 and (share * table.sum(axis=0)).min() < MIN_EXPECTED:
            order = np.argsort(table.sum(axis=0))  # merge the two smallest cells
            merged = table[:, order[0]] + table[:, order[1]]
            table = np.column_stack([np.delete(table, order[:2], axis=1), merged])
    if table.shape[1] < 2:
        return 0.0, 0
    expected = share * table.sum(axis=0)
    return float(((table - expected) ** 2 / expected).sum()), table.shape[1] - 1


def stratified_homogeneity(name: str, labels_a, strata_a, labels_b, strata_b) -> TestResult:
    """Homogeneity within each stratum, statistics and degrees of freedom summed (independent strata)."""
    labels_a, labels_b = np.asarray(labels_a), np.asarray(labels_b)
    strata_a, strata_b = np.asarray(strata_a), np.asarray(strata_b)
    statistic, dof = 0.0, 0
    for key in np.union1d(strata_a, strata_b):
        s, d = homogeneity(labels_a[strata_a == key], labels_b[strata_b == key])
        statistic, dof = statistic + s, dof + d
    return TestResult(name, statistic, chi2_sf(statistic, dof), dof)


# ---------------------------------------------------------------------------------------------
# Power and the verdict
# ---------------------------------------------------------------------------------------------


def min_detectable_shift(se: float, alpha: float, power: float = POWER) -> float:
    """Smallest true mean shift a two-sided z test at level ``alpha`` rejects with probability ``power``."""
    return (NORMAL.inv_cdf(1 - alpha / 2) + NORMAL.inv_cdf(power)) * se


def simulated_power(a: ArmSample, b: ArmSample, shift: float, alpha: float, reps: int = 200, seed: int = 0) -> dict:
    """Rejection rate of the length tests when arm a's lengths are shifted by ``shift`` tokens: each
    rep resamples both arms from the pooled responses of each prompt (the null), then adds the shift."""
    rng = np.random.default_rng(seed)
    la, lb = np.asarray(a.lengths, dtype=np.float64), np.asarray(b.lengths, dtype=np.float64)
    pa, pb = np.asarray(a.prompt_index), np.asarray(b.prompt_index)
    rejected = {"mean": 0, "mann_whitney": 0, "bins": 0}
    for _ in range(reps):
        xa, xb = np.empty_like(la), np.empty_like(lb)
        for key in np.union1d(pa, pb):
            pool = np.concatenate([la[pa == key], lb[pb == key]])
            xa[pa == key] = rng.choice(pool, (pa == key).sum())
            xb[pb == key] = rng.choice(pool, (pb == key).sum())
        xa += shift
        rejected["mean"] += stratified_mean_difference(xa, pa, xb, pb).z_test().p_value < alpha
        rejected["mann_whitney"] += mann_whitney(xa, xb).p_value < alpha
        ba, bb = length_bins(xa, xb)
        rejected["bins"] += stratified_homogeneity("", ba, pa, bb, pb).p_value < alpha
    return {k: round(v / reps, 3) for k, v in rejected.items()} | {"shift": shift, "reps": reps}


def compare_arms(a: ArmSample, b: ArmSample, alpha: float = ALPHA, reference_shift: float = AB_LENGTH_SHIFT,
                 power_reps: int = 200) -> dict:  # fmt: skip
    """Every test of arm a (SAM) against arm b (baseline), the power, and the verdict."""
    la, lb = np.asarray(a.lengths), np.asarray(b.lengths)
    pa, pb = np.asarray(a.prompt_index), np.asarray(b.prompt_index)
    mean = stratified_mean_difference(la, pa, lb, pb)
    bins_a, bins_b = length_bins(la, lb)
    later_a, later_b = np.asarray(a.later_tokens), np.asarray(b.later_tokens)
    reach_a, reach_b = later_a >= 0, later_b >= 0
    tests = [
        mean.z_test(),
        mann_whitney(la, lb),
        stratified_homogeneity("lengths in pooled deciles (chi-square per prompt)", bins_a, pa, bins_b, pb),
        stratified_homogeneity("first token (chi-square per prompt)", a.first_tokens, pa, b.first_tokens, pb),
        stratified_homogeneity(
            "token at the later position (chi-square per prompt)",
            later_a[reach_a],
            pa[reach_a],
            later_b[reach_b],
            pb[reach_b],
        ),  # fmt: skip
    ]
    level = alpha / len(tests)  # Bonferroni
    mds = min_detectable_shift(mean.se, level)
    low, high = mean.interval()
    rejected = [t.name for t in tests if t.p_value < level]
    if rejected:
        verdict = "differ"
    elif mds <= reference_shift:
        verdict = "agree"
    else:
        verdict = "underpowered"
    return {
        "verdict": verdict,
        "rejected": rejected,
        "alpha_familywise": alpha,
        "alpha_per_test": level,
        "responses": {"a": len(la), "b": len(lb)},
        "mean_length": {"a": round(float(la.mean()), 3), "b": round(float(lb.mean()), 3)},
        "reaching_later_position": {"a": int(reach_a.sum()), "b": int(reach_b.sum())},
        "mean_length_difference": round(mean.difference, 3),
        "mean_length_difference_se": round(mean.se, 3),
        "mean_length_difference_95ci": [round(low, 3), round(high, 3)],
        "reference_shift": reference_shift,
        "reference_shift_outside_95ci": not (low <= reference_shift <= high),
        "min_detectable_shift_80pct": round(mds, 3),
        "simulated_power_at_reference_shift": simulated_power(a, b, reference_shift, level, reps=power_reps)
        if power_reps
        else None,
        "tests": [t.as_dict() for t in tests],
    }


# ---------------------------------------------------------------------------------------------
# Ratio of two arms' weighted means (a per-sequence metric, weighted by tokens)
# ---------------------------------------------------------------------------------------------


def _resampled_sums(values, weights, strata, reps: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """sum(w x) and sum(w) of ``reps`` bootstrap samples: units drawn with replacement within each stratum."""
    values, weights, strata = np.asarray(values, np.float64), np.asarray(weights, np.float64), np.asarray(strata)
    num, den = np.zeros(reps), np.zeros(reps)
    for key in np.unique(strata):
        x, w = values[strata == key], weights[strata == key]
        pick = rng.integers(0, len(x), size=(reps, len(x)))
        num += (w * x)[pick].sum(axis=1)
        den += w[pick].sum(axis=1)
    return num, den


def weighted_mean_ratio(a, weights_a, strata_a, b, weights_b, strata_b, alpha: float = 0.05,
                        power: float = POWER, reps: int = 4000, seed: int = 0) -> dict:  # fmt: skip
    """Ratio of arm a's weighted mean to arm b's, each sum(w x) / sum(w) over its units (per-sequence
    metrics weighted by their tokens give verl's token means), with a bootstrap interval: units resampled
    within each stratum of each arm, the interval of log(ratio) by percentiles. ``min_detectable_change``
    is the smallest relative change of the ratio (up or down) that a test at level ``alpha`` on log(ratio)
    rejects with probability ``power``: exp((z_{1-alpha/2} + z_power) x se) - 1, se the bootstrap's.
    Both means must keep one sign, the same, in every draw (a negative metric, such as chi2_token when the
    engine's log-probs sit above the trainer's, gives the ratio of magnitudes); otherwise the ratio has no
    log and only the point estimate and the share of draws of the other sign are given."""
    rng = np.random.default_rng(seed)
    mean_a = float(np.dot(weights_a, a) / np.sum(weights_a))
    mean_b = float(np.dot(weights_b, b) / np.sum(weights_b))
    num_a, den_a = _resampled_sums(a, weights_a, strata_a, reps, rng)
    num_b, den_b = _resampled_sums(b, weights_b, strata_b, reps, rng)
    boot_a, boot_b = num_a / den_a, num_b / den_b
    out = {"mean_a": mean_a, "mean_b": mean_b, "ratio": mean_a / mean_b if mean_b else math.nan, "reps": reps}
    sign = np.sign(mean_a)
    same_sign = (np.sign(boot_a) == sign) & (np.sign(boot_b) == sign)
    if sign == 0 or np.sign(mean_b) != sign or not same_sign.all():
        return out | {"log_ratio_defined": False, "draws_changing_sign": float(1 - same_sign.mean())}
    log_ratio = np.log(np.abs(boot_a)) - np.log(np.abs(boot_b))
    low, high = np.quantile(log_ratio, [alpha / 2, 1 - alpha / 2])
    se = float(log_ratio.std(ddof=1))
    return out | {
        "log_ratio_defined": True,
        "ratio_ci": [float(np.exp(low)), float(np.exp(high))],
        "level": 1 - alpha,
        "se_log_ratio": se,
        "min_detectable_change": math.exp((NORMAL.inv_cdf(1 - alpha / 2) + NORMAL.inv_cdf(power)) * se) - 1,
        "power": power,
    }
