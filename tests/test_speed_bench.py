"""benchmarks.speed: drafters timed side by side in one run (what the timer returns, not how fast)."""

from dataclasses import replace

import numpy as np
import pytest

from benchmarks import speed
from sam_rollout.drafter import DraftConfig


def _corpus():
    return np.random.default_rng(0).integers(0, 50, size=8000).astype(np.int32)


def test_side_by_side_timing_reports_every_configuration_against_the_first():
    configs = {c: DraftConfig(group_aware=False, continuation=c) for c in ("first", "adaptive")}
    timed = speed.sam_step_us(_corpus(), context=512, batch=4, configs=configs, steps=20)
    assert list(timed) == ["first", "adaptive"]
    assert timed["first"]["ratio"] == 1.0
    for t in timed.values():
        assert t["us"] > 0 and np.isfinite(t["ratio"]) and t["ratio"] > 0 and 0 <= t["drafted_per_row_step"] <= 3


def test_the_engine_path_and_the_drafter_calls_are_timed_in_the_same_steps():
    config = DraftConfig(group_aware=False)
    configs = {"engine": config, "calls": config, "fused": config}
    paths = {"calls": speed.DRAFTER_CALLS, "fused": speed.FUSED}
    timed = speed.sam_step_us(_corpus(), context=512, batch=4, configs=configs, steps=20, paths=paths)
    assert list(timed) == ["engine", "calls", "fused"]
    with pytest.raises(ValueError, match="not timed"):
        speed.sam_step_us(_corpus(), context=512, batch=4, configs={"a": config}, steps=2, paths={"b": speed.FUSED})


def test_every_path_drafts_what_the_engine_path_drafts():
    """The paths differ in how the drafter is called, not in what it drafts: the fused path's
    drafts (zero-padded to k) equal the stepper's, step after step."""
    corpus = np.tile(np.arange(40, dtype=np.int32), 60)  # periodic: every row drafts full length
    corpus[::7] = 3  # and not always the same thing
    rows = np.stack([corpus[off : off + 700] for off in (0, 13, 101)])
    config = DraftConfig(group_aware=False, continuation="adaptive")
    steps = {path: speed.start_batch(config, path, rows, context=600, k=3) for path in speed.PATHS}
    lengths = np.full(3, 600, dtype=np.int32)
    for n in (1, 3, 2, 4):
        before, lengths = lengths, lengths + n
        accepted = [rows[b, before[b] : lengths[b]].tolist() for b in range(3)]
        drafts = {path: step(lengths, accepted) for path, step in steps.items()}
        engine = drafts[speed.STEPPER]
        assert any(engine)
        for path in (speed.FUSED, speed.DRAFTER_CALLS):
            proposal = drafts[path]
            assert [proposal.tokens[i, : proposal.lengths[i]].tolist() for i in range(3)] == engine, path
    with pytest.raises(ValueError, match="unknown drafting path"):
        speed.start_batch(config, "batched", rows, context=600, k=3)


def test_siblings_share_their_prompt_and_a_revisit_drafts_its_earlier_text_to_the_cap():
    rows = np.random.default_rng(1).integers(0, 1000, size=(4, 900)).astype(np.int32)  # nothing repeats
    siblings = speed.Siblings(size=2, prompt_tokens=64)
    siblings.group(rows, context=600)
    assert (rows[0, :64] == rows[1, :64]).all() and (rows[2, :64] == rows[3, :64]).all()
    assert not (rows[1, :64] == rows[2, :64]).all() and not (rows[0, 64:] == rows[1, 64:]).all()
    own = DraftConfig(k=16, length_policy="match", group_aware=False)
    configs = {"own": own, "revisit": replace(own, group_aware=True, prompt_store=True)}
    steps = {name: speed.start_batch(c, speed.STEPPER, rows, context=600, k=None, siblings=siblings)
             for name, c in configs.items()}  # fmt: skip
    lengths = np.full(4, 600, dtype=np.int32)
    for n in (1, 3, 2):
        before, lengths = lengths, lengths + n
        accepted = [rows[b, before[b] : lengths[b]].tolist() for b in range(4)]
        drafts = {name: step(lengths, accepted) for name, step in steps.items()}
        # the store holds each sibling's whole row: its next 16 tokens, drafted to the cap
        assert drafts["revisit"] == [rows[b, lengths[b] : lengths[b] + 16].tolist() for b in range(4)]
        assert max(len(d) for d in drafts["own"]) < 16
    corpus = np.random.default_rng(2).integers(0, 1000, size=20000).astype(np.int32)
    timed = speed.sam_step_us(corpus, context=600, batch=4, configs=configs, steps=20, k=None, siblings=siblings)
    assert timed["revisit"]["drafted_per_row_step"] == 16 and timed["own"]["drafted_per_row_step"] < 2
    with pytest.raises(ValueError, match="engine's path"):
        speed.start_batch(own, speed.FUSED, rows, context=600, k=3, siblings=siblings)
    with pytest.raises(ValueError, match="no own text"):
        speed.Siblings(prompt_tokens=600).group(rows, context=600)
    with pytest.raises(ValueError, match="size >= 1"):
        speed.Siblings(size=0)
