"""The fixed-weight losslessness benchmark's artifacts (benchmarks/results/fixed_weight_lossless_*.json)
recompute from their own samples: each run's comparison, and the pooled report from the two runs."""

import json
from pathlib import Path

import pytest

from evals import fixed_weight_lossless as fwl

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
RUNS = ["fixed_weight_lossless_2026-12-04.json", "fixed_weight_lossless_2026-12-04_replicate.json"]
POOLED = "fixed_weight_lossless_2026-12-04_pooled.json"
RECOMPUTED = ("verdict", "mean_length_difference", "mean_length_difference_95ci", "min_detectable_shift_80pct")


def load(name):
    return json.loads((RESULTS / name).read_text())


@pytest.mark.parametrize("name", RUNS)
def test_each_run_recomputes_from_its_samples(name):
    report = load(name)
    assert report["arms"]["sam"]["sam"]["draft_tokens"] > 0  # SAM drafted in the SAM arm
    again = fwl.pooled_comparison([report])
    for key in RECOMPUTED:
        assert again[key] == report["comparison"][key], key


def test_the_pooled_report_recomputes_from_the_runs():
    again = fwl.pooled_comparison([load(name) for name in RUNS])
    saved = load(POOLED)["comparison"]
    for key in RECOMPUTED:
        assert again[key] == saved[key], key
