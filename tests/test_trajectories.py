"""A prompt is a prompt on the engine side: a later turn of a multi-turn rollout, or a resumed partial
rollout, reaches the engine as a new request whose prompt is the first prompt + the trajectory so far
(+ tool outputs). The stepper starts it in its first prompt's group, drafts from the first prompt's
stored responses, counts its trajectory's store lookup once, and the store keeps the trajectory once.
"""

from __future__ import annotations

import numpy as np
import pytest

from sam_rollout.drafter import SOURCE_STORE
from sam_rollout.drafter.prompt_store import prompt_key
from sam_rollout.drafter.trajectories import Continuation, Trajectory, TrajectoryIndex
from sam_rollout.settings import SamSettings
from sam_rollout.stepper import SamStepper

WIDTH = 256
PROMPT = np.array([3, 1, 4, 1, 5], dtype=np.int32)
EARLIER = np.arange(1000, 1040, dtype=np.int32)  # an earlier visit's response to PROMPT (in the store)


def span(start, n):
    return np.arange(start, start + n, dtype=np.int32)


class Engine:
    """A minimal engine around a stepper: rows of prompt + generated tokens, one token a step."""

    def __init__(self, **settings):
        self.stepper = SamStepper(
            SamSettings.from_mapping(3, {"prompt_store": True, "switch": None, **settings}), WIDTH
        )
        self.rows: dict[str, np.ndarray] = {}  # live request -> prompt + what it generated
        self.prompt_lengths: dict[str, int] = {}

    def add(self, rid, prompt):
        self.rows[rid] = np.asarray(prompt, dtype=np.int32)
        self.prompt_lengths[rid] = len(prompt)

    def step(self, tokens: dict[str, int]) -> dict[str, list[int]]:
        """Every live request emits its token in `tokens` (none: a row without one); the drafts."""
        ids = list(self.rows)
        for rid, token in tokens.items():
            self.rows[rid] = np.append(self.rows[rid], np.int32(token))
        table = np.zeros((len(ids), WIDTH), dtype=np.int32)
        for i, rid in enumerate(ids):
            table[i, : len(self.rows[rid])] = self.rows[rid]
        lengths = np.array([len(self.rows[r]) for r in ids], dtype=np.int32)
        npt = np.array([self.prompt_lengths[r] for r in ids], dtype=np.int32)
        sampled = [[tokens[r]] if r in tokens else [] for r in ids]
        return dict(zip(ids, self.stepper.step(ids, npt, sampled, lengths, table)))

    def generate(self, rid, tokens) -> list[list[int]]:
        """`rid` emits `tokens` one a step (other rows idle); the drafts it got at each step."""
        return [self.step({rid: int(t)})[rid] for t in tokens]

    def finish(self, rid) -> np.ndarray:
        """The request ends; its generated tokens."""
        row = self.rows.pop(rid)
        self.stepper.finish(rid)
        return row[self.prompt_lengths.pop(rid) :]

    @property
    def store(self):
        return self.stepper.drafter.prompt_store

    def lookups(self) -> int:
        s = self.store.stats()
        return s.hits + s.misses

    def group_of(self, rid):
        return self.stepper.drafter._group_of[rid]


def stored(engine) -> dict[bytes, list[list[int]]]:
    return {key: [r.tolist() for r in responses] for key, responses in engine.store.items()}


def earlier_visit(engine):
    engine.add("v1", PROMPT)
    engine.generate("v1", EARLIER)
    engine.finish("v1")


def test_three_turns_are_one_trajectory_of_their_first_prompt():
    engine = Engine()
    earlier_visit(engine)
    lookups, started_with_store = engine.lookups(), engine.stepper.metrics.started_with_store
    engine.add("a", PROMPT)  # two siblings: a's trajectory and b
    engine.add("b", PROMPT)
    engine.step({"a": 2000, "b": 3000})
    for t in range(1, 10):
        engine.step({"a": 2000 + t, "b": 3000 + t})
    turn1 = engine.finish("a")  # b still runs: turn 2 joins the live group
    tool1 = span(4000, 5)
    engine.add("a2", np.concatenate([PROMPT, turn1, tool1]))
    drafts = engine.generate("a2", EARLIER[10:14])  # its response follows the earlier visit's
    assert engine.group_of("a2") == engine.group_of("b")
    assert drafts[-1] == EARLIER[14:17].tolist()
    assert engine.stepper.drafter.propose(["a2"]).sources[0] == SOURCE_STORE
    engine.generate("a2", span(2100, 4))
    turn2 = engine.finish("a2")
    engine.finish("b")
    tool2 = span(4100, 3)  # turn 3 starts after the group was freed: its group starts again
    engine.add("a3", np.concatenate([PROMPT, turn1, tool1, turn2, tool2]))
    drafts = engine.generate("a3", EARLIER[20:23])
    assert drafts[-1] == EARLIER[23:26].tolist()  # the first prompt's stored responses
    turn3 = engine.finish("a3")

    assert engine.lookups() == lookups + 1  # the trajectory's (and b's) visit, counted once
    m = engine.stepper.metrics
    assert m.started_with_store - started_with_store == 4  # a, b and a's later turns inherit a's
    trajectory = np.concatenate([turn1, tool1, turn2, tool2, turn3]).tolist()
    b_response = span(3000, 10).tolist()
    # one entry for the prompt, the trajectory once (its turns 1 and 2 replaced), b's and the earlier visit's
    assert stored(engine) == {prompt_key(PROMPT): [EARLIER.tolist(), b_response, trajectory]}


def test_a_resumed_partial_rollout_replaces_its_partial():
    engine = Engine()
    engine.add("x", PROMPT)
    engine.generate("x", span(2000, 6))
    engine.finish("x")  # aborted (a weight sync)
    assert stored(engine) == {prompt_key(PROMPT): [span(2000, 6).tolist()]}
    # resumed with what it generated, one token past what the drafter saw
    engine.add("x-resumed", np.concatenate([PROMPT, span(2000, 7)]))
    engine.generate("x-resumed", span(2007, 5))
    engine.finish("x-resumed")
    assert stored(engine) == {prompt_key(PROMPT): [span(2000, 12).tolist()]}
    assert engine.lookups() == 1 and engine.stepper.metrics.started == 2


def test_a_resume_with_nothing_generated_is_its_prompt_again():
    engine = Engine()
    engine.add("x", PROMPT)
    engine.step({})  # its prefill, nothing sampled yet
    engine.finish("x")  # aborted: nothing ties a later prompt to it
    engine.add("x-resumed", PROMPT)
    engine.generate("x-resumed", span(2000, 4))
    engine.finish("x-resumed")
    assert stored(engine) == {prompt_key(PROMPT): [span(2000, 4).tolist()]}
    assert engine.lookups() == 2  # two visits of the prompt, as the engine saw them


def test_a_shared_prefix_without_emitted_tokens_is_another_prompt():
    system = span(500, 6)
    engine = Engine()
    engine.add("s", np.concatenate([system, [7, 8]]))
    engine.generate("s", span(2000, 5))
    engine.finish("s")
    engine.add("same-system", np.concatenate([system, [9]]))
    engine.add("same-prompt", np.concatenate([system, [7, 8, 2001, 2002]]))  # not s's emitted tokens
    engine.step({})
    assert engine.group_of("same-system") != engine.group_of("same-prompt")
    engine.generate("same-prompt", span(3000, 3))
    engine.finish("same-prompt")
    assert engine.lookups() == 3 and len(engine.store) == 2


@pytest.mark.parametrize("group_aware", [True, False])
def test_history_gets_each_generated_token_once(group_aware):
    engine = Engine(history_tokens=10_000, group_aware=group_aware)
    engine.add("a", PROMPT)
    engine.generate("a", span(2000, 10))
    turn1 = engine.finish("a")
    engine.add("a2", np.concatenate([PROMPT, turn1, span(4000, 5)]))
    engine.generate("a2", span(2100, 8))
    engine.finish("a2")
    assert engine.stepper.drafter.history_tokens == 18  # turn 1 and turn 2's own tokens
    (responses,) = stored(engine).values()
    assert responses == [np.concatenate([turn1, span(4000, 5), span(2100, 8)]).tolist()]


def test_without_group_or_store_nothing_is_kept():
    engine = Engine(prompt_store=False, group_aware=False)
    assert engine.stepper._trajectories is None
    engine.add("a", PROMPT)
    engine.generate("a", span(2000, 3))
    engine.finish("a")


def test_a_turn_whose_text_ran_past_its_stop_is_still_continued():
    """The last step accepted drafts past the stop: the drafter saw 2 tokens the output (and so the next
    turn's prompt) does not hold. The next turn still continues the trajectory and replaces that text."""
    engine = Engine()  # k = 3: up to 3 tokens past a stop
    engine.add("a", PROMPT)
    engine.generate("a", np.concatenate([span(2000, 8), [2999, 2998]]))
    engine.finish("a")
    engine.add("a2", np.concatenate([PROMPT, span(2000, 8), span(4000, 5)]))
    engine.generate("a2", span(2100, 4))
    engine.finish("a2")
    assert stored(engine) == {
        prompt_key(PROMPT): [np.concatenate([span(2000, 8), span(4000, 5), span(2100, 4)]).tolist()]
    }
    assert engine.lookups() == 1


# -- the index ---------------------------------------------------------------------------------------
def text(*parts):
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in parts])


def fields(found: Continuation) -> tuple:
    return found.trajectory, found.earlier_length, found.rest.tolist()


def test_index_finds_the_longest_text_a_prompt_starts_with():
    index = TrajectoryIndex(8, dropped_tokens=0)
    first, later = Trajectory(3, "g", True), Trajectory(3, "g", False)
    index.add(span(0, 3), span(10, 2), first)
    index.add(span(0, 3), text(span(10, 2), span(20, 4)), later)
    index.add(span(0, 3), np.empty(0, dtype=np.int32), Trajectory(3, "none", False))  # nothing to tie
    assert len(index) == 2
    assert fields(index.find(text(span(0, 3), span(10, 2)))) == (first, 2, [])  # the text itself: a resume
    assert fields(index.find(text(span(0, 3), span(10, 2), [99]))) == (first, 2, [])
    assert fields(index.find(text(span(0, 3), span(10, 2), span(20, 4), [99]))) == (later, 6, [])
    assert index.find(span(0, 3)) is None and index.find(text(span(0, 3), [11, 10])) is None
    assert index.find(np.empty(0, dtype=np.int32)) is None


def test_index_allows_dropped_tokens_but_keeps_a_response_token():
    index = TrajectoryIndex(8, dropped_tokens=2)
    trajectory = Trajectory(3, "g", False)
    index.add(span(0, 3), span(10, 6), trajectory)  # the engine may have kept only 10..13
    found = index.find(text(span(0, 3), span(10, 4), [99]))
    assert found.trajectory is trajectory and found.earlier_length == 4 and found.rest.tolist() == [14, 15]
    assert found.earlier_response(text(span(10, 4), [99, 7])).tolist() == span(10, 6).tolist()
    assert index.find(text(span(0, 3), span(10, 3), [99])) is None  # 3 dropped: more than 2
    short = TrajectoryIndex(8, dropped_tokens=2)
    short.add(span(0, 3), text([10, 11]), trajectory)
    assert short.find(text(span(0, 3), [10, 99])).rest.tolist() == [11]
    assert short.find(text(span(0, 3), [99])) is None  # a prefix of the prompt alone ties nothing


def test_index_keeps_the_newest_capacity_texts():
    index = TrajectoryIndex(3, dropped_tokens=1)
    texts = [(np.array([p], dtype=np.int32), np.array([100 + p], dtype=np.int32)) for p in range(5)]
    for p, (prompt, response) in enumerate(texts):
        index.add(prompt, response, Trajectory(1, p, False))
    assert len(index) == 3
    found = [index.find(text(prompt, response, [7])) for prompt, response in texts]
    assert [c.trajectory.group if c else None for c in found] == [None, None, 2, 3, 4]
    with pytest.raises(ValueError, match="capacity"):
        TrajectoryIndex(0, dropped_tokens=1)


def test_index_hash_collisions_are_confirmed():
    """Texts of equal length and polynomial hash but other tokens are not a match (BLAKE2b confirms)."""
    index = TrajectoryIndex(4, dropped_tokens=0)
    index.add(np.array([1], dtype=np.int32), np.array([2], dtype=np.int32), Trajectory(1, "g", False))
    index._hashes[0] = index._prefix_hashes(np.array([5, 6], dtype=np.int32))[-1]  # a forged collision
    assert index.find(np.array([5, 6, 7], dtype=np.int32)) is None


def test_drafter_rejects_a_continuation_its_prompt_cannot_hold():
    engine = Engine()
    for length, earlier in ((0, 1), (5, 1), (6, 0)):
        with pytest.raises(ValueError, match="cannot hold"):
            engine.stepper.drafter.start(
                "r", PROMPT, continues=Continuation(Trajectory(length, None, False), earlier, [])
            )
    assert "r" not in engine.stepper.drafter
