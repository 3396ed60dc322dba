"""The chi-square goodness-of-fit p-value the exactness checks use (tests and the GPU engine checks)."""

from __future__ import annotations

import numpy as np
import torch

MIN_EXPECTED_COUNT = 5.0


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness-of-fit p-value of observed ``counts`` against ``probs`` (same shape, any).

    Cells expected below MIN_EXPECTED_COUNT are pooled into one cell; a count
    in a zero-probability cell gives p = 0.
    """
    counts, probs = counts.ravel().astype(np.float64), probs.ravel().astype(np.float64)
    if counts[probs == 0].sum() > 0:
        return 0.0
    counts, probs = counts[probs > 0], probs[probs > 0]
    expected = counts.sum() * probs / probs.sum()
    small = expected < MIN_EXPECTED_COUNT
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    statistic = float(((counts - expected) ** 2 / expected).sum())
    degrees_of_freedom = len(counts) - 1
    # Chi-square survival function = regularised upper incomplete gamma Q(dof/2, x/2).
    return float(
        torch.special.gammaincc(
            torch.tensor(degrees_of_freedom / 2, dtype=torch.float64),
            torch.tensor(statistic / 2, dtype=torch.float64),
        )
    )
