"""benchmarks.speed: drafters timed side by side in one run (what the timer returns, not how fast)."""

import numpy as np

from benchmarks import speed
from sam_rollout.drafter import DraftConfig


def test_side_by_side_timing_reports_every_configuration_against_the_first():
    corpus = np.random.default_rng(0).integers(0, 50, size=8000).astype(np.int32)
    configs = {c: DraftConfig(group_aware=False, continuation=c) for c in ("first", "adaptive")}
    timed = speed.sam_step_us(corpus, context=512, batch=4, configs=configs, steps=20)
    assert list(timed) == ["first", "adaptive"]
    assert timed["first"]["ratio"] == 1.0
    for t in timed.values():
        assert t["us"] > 0 and np.isfinite(t["ratio"]) and t["ratio"] > 0
