"""The long-trace replay and the greedy-against-sampled benchmark on tiny synthetic traces: which responses each
case replays and scores, and how a gain ratio carries to a profile."""

import numpy as np
import pytest

from benchmarks import long_replay, sampling_gap
from benchmarks.traces import SampledGroup, write_traces
from testkit.data import CHECKPOINT_RUN, LongTrace


def text(n, seed):
    return np.random.default_rng(seed).integers(0, 500, size=n).astype(np.int32)


def trace(prompt_id, run, finished, seed, checkpoint=None, n=300):
    return LongTrace(prompt_id, run, checkpoint, finished, text(10, sum(map(ord, prompt_id))), text(n, seed))


def test_first_visits_take_one_finished_response_per_prompt_outside_the_checkpoint_run():
    traces = [
        trace("a", "m1", True, 1),
        trace("a", "m2", True, 2),  # a second model's answer to a: not a first visit
        trace("b", "m1", False, 3),
        trace("b", "m2", True, 4),
        trace("c", CHECKPOINT_RUN, True, 5, checkpoint=21),
    ]
    groups, halves = long_replay.first_visits(traces)
    assert [g.responses[0].tolist() for g in groups] == [traces[0].response.tolist(), traces[3].response.tolist()]
    assert halves == ["tune", "held_out"]
    unfinished, _ = long_replay.first_visits(traces, finished=False)
    assert [g.responses[0].tolist() for g in unfinished] == [traces[2].response.tolist()]


def test_revisits_draft_from_the_earlier_checkpoint_through_the_store():
    """A prompt answered the same way at two checkpoints: its second answer is scored and drafts from the first
    (prompt store and history); an unfinished answer is left out, a prompt seen once is not scored."""
    same = dict(prompt_id="p", run=CHECKPOINT_RUN, finished=True, seed=7)
    traces = [trace(checkpoint=35, **same), trace(checkpoint=21, **same), trace("q", CHECKPOINT_RUN, True, 8, 35)]
    traces.append(trace("p", CHECKPOINT_RUN, False, 9, checkpoint=49))
    visits, parts = long_replay.checkpoint_visits(traces)
    assert [[key for key, _ in v] for v in visits] == [["p"], ["p", "q"]]
    row = long_replay.run_case("revisits", long_replay.METHODS[0], 3, traces)
    assert row["all"]["tokens"] == 299 and row[parts["q"]]["steps"] == 0
    assert row["all"]["acceptance_length"] > 3.5


def test_gain_ratio_and_carry():
    greedy = {"by_position": {"0-128": 2.0, "128+": 3.0}, "steps_by_position": {"0-128": 5000, "128+": 10}}
    sampled = {"by_position": {"0-128": 1.5, "128+": 1.0}, "steps_by_position": {"0-128": 5000, "128+": 5000}}
    assert sampling_gap.gain_ratios(greedy, sampled) == [0.5, None]  # 128+: too few greedy steps
    profile = {"methods": {"sam": {"tokens_per_step": [2.0, None], "drafted_per_step": [3.0, 3.0]}}, "notes": []}
    carried = sampling_gap.carry(profile, 0.5, 0.9)["methods"]["sam"]
    assert carried["tokens_per_step"] == [1.5, None]
    assert carried["drafted_per_step"] == pytest.approx([2.7, 2.7])


def test_sampling_gap_replays_each_sample_index_apart(tmp_path):
    """Pass j holds sample j of every prompt, finished or cut, so no history holds a sibling."""
    groups = [
        SampledGroup(i, text(10, i), [text(50, 10 * i), text(60, 10 * i + 1)], ["stop", "length"]) for i in range(3)
    ]
    path = write_traces(tmp_path / "t.npz", groups, {"vocab_size": 500})
    finished = sampling_gap.passes(path, finished=True)
    cut = sampling_gap.passes(path, finished=False)
    assert [len(p) for p in finished] == [3, 0] and [len(p) for p in cut] == [0, 3]
    assert [len(g.responses[0]) for g in cut[1]] == [60, 60, 60]
