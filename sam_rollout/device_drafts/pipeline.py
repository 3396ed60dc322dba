"""The drafting pipeline: the engine's thread launches each step's device ops and goes on; a drafting
thread turns the step's report into drafts while the device runs.

Engine thread, per step t (``step``): write the plan into ring slot t % slots, launch ``report_step``,
record an event, queue the step for the drafting thread and, if the step's draft width is not 0,
launch ``await_drafts`` into the engine's draft tensor. Nothing here waits for the device, except
that a ring slot is reused only once the drafting thread is done with the step that used it last
(at most ``slots - 1`` steps in flight).

Drafting thread, in launch order: wait for the step's event, bring its token rows up to date from the
report (``HostRows``), call the drafting function, write the drafts (each row filled out with its last
token) and post the step. Finished requests and other calls that touch the drafter's state (``in_order``,
``call``) run on this thread too, between the steps launched before and after them, so the drafter
sees the engine's events in the engine's order and is never touched by two threads.

A drafting error or a device op that stopped waiting (``StepRing.timed_out``) is raised on the engine's
thread at its next call: outputs stay exact (the device verified fillers), but the engine stops rather
than run on with a drafter in an unknown state.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from sam_rollout.device_drafts.ops import await_drafts, report_step
from sam_rollout.device_drafts.ring import StepRing, window_plan
from sam_rollout.device_drafts.streams import DeviceStream, Event

# drafts(req_ids, prompt_lengths, sampled_token_ids, lengths, token_rows, k) -> one list per row
DraftFunction = Callable[[list, np.ndarray, list, np.ndarray, np.ndarray, int], Sequence[Sequence[int]]]
RING_SLOTS = 4
TIMEOUT_S = 10.0  # how long the device waits for a step's drafts before it verifies fillers and reports it
# the interpreter's switch interval (default 5 ms) bounds how long the drafting thread, woken by the
# device, may wait for the GIL while the engine's thread runs Python
SWITCH_INTERVAL_S = 2e-4

logger = logging.getLogger(__name__)


@dataclass
class StepPlan:
    """One step as the drafting thread gets it: all known on the host when the step was launched."""

    step: int
    slot: int  # ring slot
    req_ids: list
    prompt_lengths: np.ndarray
    from_start: np.ndarray  # bool per row: the window is the row's whole history
    counts: np.ndarray  # window tokens planned per row
    window: np.ndarray  # the slot's window tokens (pinned host memory the report writes into)
    width: int  # tokens to draft per row (0: nobody waits for this step's drafts)
    event: Event | None = None  # reached once the step's report is written


def compile_wait(device: torch.device, width: int) -> None:
    """Compile the wait's kernel (Triton, a few hundred ms) before the engine serves, on a ring already posted."""
    ring = StepRing(2, 1, width, device)
    ring.posted.np[0] = ring.valid.np[0] = 0
    out = torch.zeros((1, max(width, 1)), dtype=torch.int64, device=device)
    await_drafts(ring, 0, 0, 1, out, torch.zeros(1, dtype=torch.int64, device=device), TIMEOUT_S)
    torch.cuda.synchronize(device)


class HostRows:
    """The drafting thread's view of each batch row's tokens, row i = batch row i (the layout drafters
    take). A row is brought up to date from its window: the row's newest tokens, or all of them for a
    row read for the first time. Positions before a window are stale where a request moved rows; the
    drafter reads only what it has not seen, which the window holds."""

    def __init__(self, max_rows: int, max_model_len: int):
        self.tokens = np.zeros((max_rows, max_model_len), dtype=np.int32)

    def update(self, plan: StepPlan, lengths: np.ndarray, window: int, window_tokens: np.ndarray) -> None:
        starts = np.where(plan.from_start, 0, np.maximum(lengths - window, 0)).astype(np.int64)
        fresh = lengths.astype(np.int64) - starts
        short = np.flatnonzero(fresh > plan.counts)
        if short.size:
            i = int(short[0])
            raise RuntimeError(
                f"device drafts: row {i} ({plan.req_ids[i]!r}) holds {int(lengths[i])} tokens, more than the "
                f"{int(plan.counts[i])} planned for its first read at step {plan.step}"
            )
        rows, offsets = window_plan(fresh)
        first = np.cumsum(plan.counts) - plan.counts  # where each row's window starts in the flat window
        self.tokens[rows, starts[rows] + offsets] = window_tokens[first[rows] + offsets]


class DraftPipeline:
    """See the module docstring. ``draft`` is called on the drafting thread only; ``in_order`` and ``call``
    are the way to reach whatever state it keeps."""

    def __init__(
        self,
        stream: DeviceStream,
        draft: DraftFunction,
        max_rows: int,
        max_model_len: int,
        width: int,
        slots: int = RING_SLOTS,
        timeout_s: float = TIMEOUT_S,
        name: str = "SAM device drafts",
    ):
        self.stream = stream
        self.max_model_len, self.width = int(max_model_len), int(width)
        self.window = self.width + 1  # a step commits at most width + 1 tokens per row
        self.timeout_s = float(timeout_s)
        self.ring = StepRing(slots, max_rows, self.width, stream.device, window_tokens=max_rows * self.window)
        self.rows = HostRows(max_rows, self.max_model_len)
        self._draft = draft
        self._known: dict = {}  # engine thread: request id -> request-state slot whose history was read
        self._next_step = 0
        self._done = -1  # drafting thread: the last step finished
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        if stream.device.type == "cuda":
            compile_wait(stream.device, self.width)
            if sys.getswitchinterval() > SWITCH_INTERVAL_S:
                logger.info("%s: the interpreter's switch interval set to %.1f ms", name, 1e3 * SWITCH_INTERVAL_S)
                sys.setswitchinterval(SWITCH_INTERVAL_S)

    # -- the engine's thread ----------------------------------------------------------------------------
    def step(
        self,
        req_ids: Sequence,
        request_slots: np.ndarray,
        prompt_lengths: np.ndarray,
        prefill_lengths: np.ndarray,
        width: int,
        all_token_ids: torch.Tensor,
        total_len: torch.Tensor,
        num_sampled: torch.Tensor,
        fill: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        """Launch step t: its report, and (``width`` > 0) the wait that fills ``out[:rows]`` with the drafts
        of ``width`` tokens, fillers after them. ``request_slots[i]`` is row i's row in ``all_token_ids`` and
        ``total_len``, ``prefill_lengths[i]`` the tokens the engine had for it when it was added; ``fill``
        is each row's last token on the device (used only if the drafts never come)."""
        self.raise_if_failed()
        if width > self.width:
            raise ValueError(f"device drafts: width {width} over the pipeline's {self.width}")
        step, n = self._next_step, len(req_ids)
        self._next_step += 1
        slot = step % self.ring.slots
        self._wait_done(step - self.ring.slots)  # the step that used this slot last
        req_ids = list(req_ids)
        request_slots = np.asarray(request_slots, dtype=np.int64)
        from_start = np.array([self._known.get(r) != s for r, s in zip(req_ids, request_slots.tolist())], dtype=bool)
        bound = np.minimum(np.asarray(prefill_lengths, dtype=np.int64) + self.window, self.max_model_len)
        counts = np.where(from_start, bound, self.window).astype(np.int64)
        window_tokens = int(counts.sum())
        buffers = self.ring.window(slot, window_tokens)
        rows, offsets = window_plan(counts)
        buffers["row"].np[:window_tokens] = rows
        buffers["offset"].np[:window_tokens] = offsets
        self.ring.request_slot.np[slot, :n] = request_slots
        self.ring.from_start.np[slot, :n] = from_start
        self._known.update(zip(req_ids, request_slots.tolist()))
        self.stream.launch(
            report_step, self.ring, slot, n, window_tokens, buffers, self.window, all_token_ids, total_len, num_sampled
        )
        window = buffers["tokens"].np
        plan = StepPlan(step, slot, req_ids, np.asarray(prompt_lengths), from_start, counts, window, int(width))
        plan.event = self.stream.record()
        self._queue.put(("step", plan))
        if width > 0:
            self.stream.launch(await_drafts, self.ring, slot, step, n, out, fill, self.timeout_s)

    def forget(self, req_ids) -> None:
        """Requests the engine dropped: their next appearance is read from the start."""
        for r in req_ids:
            self._known.pop(r, None)

    def forget_all(self) -> None:
        self._known.clear()

    def in_order(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the drafting thread after the steps launched so far."""
        self.raise_if_failed()
        self._queue.put(("call", (fn, None)))

    def call(self, fn: Callable[[], object]):
        """``in_order``, and wait for its result."""
        self.raise_if_failed()
        future: Future = Future()
        self._queue.put(("call", (fn, future)))
        return future.result()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("device drafts: the drafting thread failed") from self._error
        timed_out = int(self.ring.timed_out.np[0])
        if timed_out >= 0:
            raise RuntimeError(
                f"device drafts: the device stopped waiting for step {timed_out}'s drafts after {self.timeout_s} s "
                "and verified fillers (outputs stay exact); the engine stops rather than risk tensor-parallel "
                "ranks verifying different drafts"
            )

    def drain(self) -> None:
        """Wait until every step launched so far is drafted (the device must have reached their events)."""
        self._wait_done(self._next_step - 1)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _wait_done(self, step: int) -> None:
        with self._cond:
            while self._done < step and self._error is None:
                self._cond.wait()

    # -- the drafting thread ----------------------------------------------------------------------------
    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            kind, payload = item
            if kind == "step":
                self._serve_step(payload)
            else:
                fn, future = payload
                try:
                    result = fn()
                except BaseException as e:  # reported on the engine's thread; the steps go on with fillers
                    self._fail(e)
                    if future is not None:
                        future.set_exception(e)
                else:
                    if future is not None:
                        future.set_result(result)

    def _serve_step(self, plan: StepPlan) -> None:
        ring, slot, n = self.ring, plan.slot, len(plan.req_ids)
        try:
            plan.event.synchronize()
            lengths = ring.total_len.np[slot, :n].astype(np.int64)
            sampled = ring.num_sampled.np[slot, :n].astype(np.int64)
            self.rows.update(plan, lengths, self.window, plan.window)
            tokens = self.rows.tokens
            sampled_token_ids = [tokens[i, lengths[i] - sampled[i] : lengths[i]].tolist() for i in range(n)]
            drafts = self._draft(plan.req_ids, plan.prompt_lengths, sampled_token_ids, lengths, tokens, plan.width)
            if plan.width > 0:
                out = ring.drafts.np[slot]
                out[:n] = tokens[np.arange(n), lengths - 1][:, None]  # the filler: each row's last token
                for i, draft in enumerate(drafts):
                    out[i, : len(draft)] = draft
                ring.valid.np[slot] = plan.step
        except BaseException as e:
            self._fail(e)
        finally:
            ring.posted.np[0] = plan.step  # after the drafts: the device reads them once it sees this
            with self._cond:
                self._done = plan.step
                self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            logger.error("device drafts: the drafting thread failed", exc_info=error)
            self._error = error
        with self._cond:
            self._cond.notify_all()
