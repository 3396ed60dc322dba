"""SAM's device-side drafting (sam_rollout.device_drafts) without a GPU: the async pipeline runs in the
engine-free harness (testkit.simulated_device), the host steps ahead of a device thread, and the drafts
the device receives at every step equal what synchronous drafting sends on the same steps. The wait's
Triton kernel runs under TRITON_INTERPRET=1 on CPU tensors, against the host's reference of it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from sam_rollout.device_drafts.ops import await_drafts, await_on_host
from sam_rollout.device_drafts.pipeline import DraftPipeline
from sam_rollout.device_drafts.ring import StepRing, window_plan
from sam_rollout.device_drafts.streams import ImmediateStream
from testkit.simulated_device import AsyncHarness, SimulatedStream, Workload

REPO = Path(__file__).resolve().parents[1]


def _run_harness(sam_spec, seed, steps=60, requests=10, rows=8, step_time_s=0.002):
    harness = AsyncHarness(
        Workload.periodic(requests, steps, seed=seed), 3, sam_spec, SimulatedStream(), rows, step_time_s
    )
    lags = []
    propose = harness.speculator.propose

    def probed(*args, **kwargs):  # how many steps the host is ahead of the device's verification
        lags.append(len(harness.steps) + 1 - len(harness.sampled))
        return propose(*args, **kwargs)

    harness.speculator.propose = probed
    try:
        harness.run(steps)
        received = [x.numpy() for x in harness.received]
        metrics = harness.speculator.with_stepper(lambda stepper: stepper.snapshot())
        return harness.reference_drafts(), received, lags, metrics
    finally:
        harness.close()


@pytest.mark.parametrize(
    "sam_spec",
    [{"switch": None}, {"switch": 4}, {"switch": None, "group_aware": False, "history_tokens": 0}],
    ids=["always", "threshold-4", "own-text"],
)
def test_device_receives_what_synchronous_drafting_sends_at_every_step(sam_spec):
    reference, received, lags, metrics = _run_harness(sam_spec, seed=3)
    assert len(received) == len(reference) > 40
    for step, (want, got) in enumerate(zip(reference, received)):
        assert np.array_equal(want, got), (step, want, got)
    assert max(lags) >= 2  # the host launched steps while the device still verified earlier ones
    assert metrics["num_drafts"] > 20 and metrics["mean_acceptance_length"] > 1.5  # it drafted, and well
    if sam_spec["switch"] == 4:
        assert 0 < metrics["frac_steps_on"] < 1  # steps of width 0 (no wait) and of width 3 both ran
    else:
        assert metrics["num_drafts"] > 100


def test_triton_kernel_under_the_interpreter_matches_the_reference():
    """The same harness run, its waits done by the Triton kernel (TRITON_INTERPRET=1, CPU tensors)."""
    probe = (
        "import numpy as np\n"
        "from tests.test_device_drafts import _run_harness\n"
        "ref, got, lags, m = _run_harness({'switch': None}, seed=5, steps=16, requests=4, rows=4)\n"
        "assert len(ref) == len(got) > 8 and all(np.array_equal(a, b) for a, b in zip(ref, got))\n"
        "assert m['num_drafts'] > 10\n"
        "from sam_rollout.device_drafts import ops\n"
        "assert ops._kernel.cache_info().currsize == 1\n"  # the kernel, not the host's loop, waited
        "print('ok')\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def _posted_ring(step, drafts, valid=True):
    ring = StepRing(2, 3, 4, "cpu")
    slot = step % 2
    ring.drafts.np[slot, :3] = drafts
    ring.valid.np[slot] = step if valid else -1
    ring.posted.np[0] = step
    return ring, slot


@pytest.mark.parametrize("case", ["posted", "invalid", "timeout"])
def test_wait_op_copies_drafts_or_fillers(case):
    drafts = np.arange(12).reshape(3, 4) + 100
    ring, slot = _posted_ring(7 if case != "timeout" else 6, drafts, valid=case != "invalid")
    fill = torch.tensor([1, 2, 3], dtype=torch.int64)
    out = torch.full((3, 4), -5, dtype=torch.int64)
    await_on_host(ring, 7 % 2, 7, 3, out, fill, timeout_s=0.01)
    want = drafts if case == "posted" else np.repeat([[1], [2], [3]], 4, axis=1)
    assert out.numpy().tolist() == want.tolist()
    assert int(ring.timed_out.np[0]) == (7 if case == "timeout" else -1)


def test_wait_op_waits_for_the_post():
    ring = StepRing(2, 2, 2, "cpu")
    out, fill = torch.zeros((2, 2), dtype=torch.int64), torch.zeros(2, dtype=torch.int64)

    def post():
        time.sleep(0.05)
        ring.drafts.np[1, :2] = [[4, 5], [6, 7]]
        ring.valid.np[1] = 3
        ring.posted.np[0] = 3

    threading.Thread(target=post).start()
    t0 = time.monotonic()
    await_drafts(ring, 1, 3, 2, out, fill, timeout_s=5.0)
    assert time.monotonic() - t0 >= 0.04 and out.tolist() == [[4, 5], [6, 7]]


def _pipeline(draft, timeout_s=5.0):
    return DraftPipeline(ImmediateStream(), draft, max_rows=2, max_model_len=16, width=2, timeout_s=timeout_s)


def _step(pipeline, width=2):
    tokens = torch.arange(32, dtype=torch.int32).reshape(2, 16)
    out = torch.zeros((2, 2), dtype=torch.int64)
    pipeline.step(
        ["a", "b"],
        np.array([0, 1]),
        np.array([4, 4]),
        np.array([4, 4]),
        width,
        tokens,
        torch.tensor([5, 5], dtype=torch.int32),
        torch.tensor([1, 1], dtype=torch.int32),
        torch.tensor([4, 20]),
        out,
    )
    return out


def test_a_drafting_error_gives_fillers_then_stops_the_engine():
    def failing(*args):
        raise ValueError("broken drafter")

    pipeline = _pipeline(failing)
    assert _step(pipeline).tolist() == [[4, 4], [20, 20]]  # fillers, at once: the device did not wait
    with pytest.raises(RuntimeError, match="drafting thread failed") as info:
        _step(pipeline)
    assert isinstance(info.value.__cause__, ValueError)
    pipeline.close()


def test_drafts_later_than_the_bound_give_fillers_then_stop_the_engine():
    def slow(req_ids, *args):
        time.sleep(0.3)
        return [[1, 2]] * len(req_ids)

    pipeline = _pipeline(slow, timeout_s=0.05)
    assert _step(pipeline).tolist() == [[4, 4], [20, 20]]
    with pytest.raises(RuntimeError, match="stopped waiting for step 0's drafts"):
        _step(pipeline)
    pipeline.close()


def test_windows_cover_each_rows_new_tokens():
    """A row read for the first time gets its whole history; a known row its newest tokens, wherever
    it moved in the batch."""

    def sampled_rows(req_ids, prompts, sampled, lengths, tokens, k):
        seen.append(([tokens[i, : lengths[i]].tolist() for i in range(len(req_ids))], sampled))
        return [[] for _ in req_ids]

    seen = []
    pipeline = DraftPipeline(ImmediateStream(), sampled_rows, max_rows=3, max_model_len=32, width=3)
    history = torch.zeros((3, 32), dtype=torch.int32)
    history[0, :6], history[2, :4] = torch.arange(10, 16), torch.arange(50, 54)
    total = torch.tensor([6, 0, 4], dtype=torch.int32)
    out = torch.zeros((3, 3), dtype=torch.int64)

    def step(req_ids, slots, sampled):
        for s, new in zip(slots, sampled):
            history[s, total[s] : total[s] + len(new)] = torch.tensor(new, dtype=torch.int32)
            total[s] += len(new)
        counts = torch.tensor([len(x) for x in sampled], dtype=torch.int32)
        pipeline.step(req_ids, np.array(slots), np.array([2] * 3)[: len(slots)], np.array([6, 0, 4])[slots], 0,
                      history, total, counts, torch.zeros(3, dtype=torch.int64), out)  # fmt: skip
        pipeline.drain()

    step(["a", "c"], [0, 2], [[16], [54]])
    step(["c", "a"], [2, 0], [[55, 56, 57, 58], [17, 18]])  # both moved rows
    assert seen[0] == ([list(range(10, 17)), list(range(50, 55))], [[16], [54]])  # first reads: everything
    rows, sampled = seen[1]
    assert sampled == [[55, 56, 57, 58], [17, 18]]
    window = pipeline.window  # a known row's newest width + 1 tokens: more than any step commits
    assert [row[-window:] for row in rows] == [list(range(55, 59)), list(range(15, 19))]
    pipeline.close()


def test_window_plan_is_row_then_offset():
    rows, offsets = window_plan(np.array([2, 0, 3]))
    assert rows.tolist() == [0, 0, 2, 2, 2] and offsets.tolist() == [0, 1, 0, 1, 2]
