"""The replay benchmark's honesty: no sibling sees another's tokens of the same step, and history holds
only responses that finished earlier."""

import numpy as np
import pytest

from benchmarks.drafters import SamDrafter
from benchmarks.replay import ALL, replay, replay_by_part, replay_revisits, replay_visits
from sam_rollout.drafter import DraftConfig
from testkit.data import TraceGroup


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


def test_revisit_proxy_scores_only_the_current_visit():
    """Each group's first response is its earlier visit, replayed (with every other earlier visit)
    before any current one; a current visit that repeats it drafts from it only through the prompt
    store (or a history that still holds it)."""
    groups = [TraceGroup(random_text(20, 10 + g), [random_text(300, 20 + g)] * 2) for g in range(3)]
    plain = replay_revisits(SamDrafter("g", DraftConfig()), groups, earlier=1)
    stored = replay_revisits(SamDrafter("g+store", DraftConfig(prompt_store=True)), groups, earlier=1)
    assert plain.acceptance_length == 1.0
    assert stored.acceptance_length > 3.5  # k + 1 = 4 tokens a step, but for the last step of each
    assert stored.tokens == plain.tokens == 3 * 299  # the current visits' decode tokens only
    with pytest.raises(ValueError, match="more than 2 responses"):
        replay_revisits(SamDrafter("g", DraftConfig()), groups, earlier=2)


def test_parts_split_the_steps_of_one_replay():
    """replay_by_part counts each group under its part and under 'all', and 'all' equals the plain replay."""
    groups = [TraceGroup(random_text(20, 30 + g), [random_text(200, seed)]) for g, seed in enumerate((40, 41, 42, 41))]
    parts = replay_by_part(SamDrafter("h", DraftConfig(history_tokens=1 << 16)), groups, ["a", "b", "a", "b"])
    whole = replay(SamDrafter("h", DraftConfig(history_tokens=1 << 16)), groups)
    assert parts[ALL].as_dict() == whole.as_dict()
    assert parts["a"].steps + parts["b"].steps == whole.steps
    assert parts["a"].acceptance_length < parts["b"].acceptance_length  # group 3 repeats group 1 from history


def test_visits_score_only_revisits_and_find_the_prompt_store():
    """A prompt's later visit repeating its earlier response drafts from the prompt store; first visits
    (a prompt never seen before) are not scored."""
    prompt, response = random_text(20, 50), random_text(300, 51)
    other = (random_text(20, 52), random_text(300, 53))
    visits = [
        [("p", TraceGroup(prompt, [response]))],
        [("p", TraceGroup(prompt, [response])), ("q", TraceGroup(other[0], [other[1]]))],
    ]
    stats = replay_visits(SamDrafter("s", DraftConfig(prompt_store=True)), visits, {"p": "a", "q": "b"})
    assert stats[ALL].tokens == stats["a"].tokens == 299 and stats["b"].steps == 0
    assert stats["a"].acceptance_length > 3.5
