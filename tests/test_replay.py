"""The replay benchmark's honesty: no sibling sees another's tokens of the same step, and history holds
only responses that finished earlier."""

import numpy as np

from benchmarks.data import TraceGroup
from benchmarks.drafters import SamDrafter
from benchmarks.replay import replay
from sam import DraftConfig


def random_text(n, seed):
    return np.random.default_rng(seed).integers(0, 1000, size=n).astype(np.int32)


def test_identical_siblings_gain_nothing_in_lockstep():
    """Siblings with the same response are in the same state every step: in honest lockstep neither has
    a follower to draft from, so the group gains nothing over a single response (a leak would give ~k+1)."""
    prompt, response = random_text(20, 0), random_text(300, 1)
    alone = replay(SamDrafter("own", DraftConfig(group_aware=False)), [TraceGroup(prompt, [response])])
    twins = replay(SamDrafter("group", DraftConfig(group_aware=True)), [TraceGroup(prompt, [response, response])])
    assert alone.acceptance_length == 1.0  # random text: nothing repeats
    assert twins.acceptance_length == 1.0


def test_sibling_ahead_is_drafted_from():
    """A span a sibling wrote in earlier steps is a draft source for the others (here: one sibling reaches
    the span only after the other has finished it, so it can draft all of it at k + 1 tokens a step)."""
    prompt = random_text(20, 2)
    shared = random_text(200, 3)
    fast = shared
    slow = np.concatenate([random_text(250, 5), shared])
    group = replay(SamDrafter("group", DraftConfig(group_aware=True)), [TraceGroup(prompt, [fast, slow])])
    own = replay(SamDrafter("own", DraftConfig(group_aware=False)), [TraceGroup(prompt, [fast, slow])])
    assert own.acceptance_length < 1.05
    # fast: 200 steps for 200 tokens; slow: 250 + 50 steps for 450 tokens -> 650 / 500
    assert group.acceptance_length > 1.25


def test_history_holds_only_earlier_groups():
    prompt, response = random_text(20, 6), random_text(300, 7)
    groups = [TraceGroup(prompt, [response]), TraceGroup(random_text(20, 8), [response])]
    stats = replay(SamDrafter("history", DraftConfig(group_aware=False, history_tokens=1 << 16)), groups)
    first = replay(SamDrafter("history", DraftConfig(group_aware=False, history_tokens=1 << 16)), groups[:1])
    assert first.acceptance_length == 1.0  # its own response is not in the history while it runs
    assert stats.tokens > first.tokens and stats.acceptance_length > 1.5  # the repeat drafts from history
