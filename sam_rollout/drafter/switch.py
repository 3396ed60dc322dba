"""When to speculate, and with how many draft tokens: the adaptive switch as a batch-size schedule.

A *schedule* is a tuple of ``(max_batch, k)`` pairs with strictly increasing ``max_batch``: a step
that schedules ``n`` requests drafts ``k`` tokens per request from the first pair with
``n <= max_batch``, and none above the last pair. The published fixed threshold ``t`` with ``k``
drafts is the one-pair schedule ``((t, k),)``. This is vLLM's ``num_speculative_tokens_per_batch_size``
idea, applied inside a proposer (vLLM never passes that K to ``custom_class``).

A schedule is given (``additional_config.sam_spec.switch`` as pairs, checked by :func:`validate_schedule`) or
derived offline from a step-cost model (``benchmarks.cost_model.derive_schedule``); ``switch: "auto"``
learns online instead (``sam_rollout.drafter.auto_switch``). No vLLM or verl imports here.
"""

from __future__ import annotations

from collections.abc import Sequence as _SequenceABC

import numpy as np

Schedule = tuple  # tuple[tuple[int, int], ...]


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_pair_list(x) -> bool:  # list, tuple or a config library's list type; never a string
    return isinstance(x, _SequenceABC) and not isinstance(x, (str, bytes))


def validate_schedule(raw, max_k: int, where: str = "schedule") -> Schedule:
    """Check a schedule given as ``[[max_batch, k], ...]`` and return it as a tuple of int pairs.

    Raises ValueError naming ``where`` for: a non-list, an empty list, an entry that is not a pair
    of integers, ``max_batch < 1``, ``max_batch`` not strictly increasing, or ``k`` outside
    ``0..max_k``.
    """
    if not _is_pair_list(raw):
        raise ValueError(f"{where} must be a list of [max_batch, k] pairs, got {raw!r}")
    if not raw:
        raise ValueError(f"{where} must hold at least one [max_batch, k] pair (use threshold 0 to turn SAM off)")
    out = []
    prev = 0
    for i, entry in enumerate(raw):
        if not _is_pair_list(entry) or len(entry) != 2:
            raise ValueError(f"{where}[{i}] must be a [max_batch, k] pair, got {entry!r}")
        b, k = entry
        if not _is_int(b) or b < 1:
            raise ValueError(f"{where}[{i}]: max_batch must be an integer >= 1, got {b!r}")
        if not _is_int(k) or not 0 <= k <= max_k:
            raise ValueError(f"{where}[{i}]: k must be an integer in 0..{max_k} (num_speculative_tokens), got {k!r}")
        if b <= prev:
            raise ValueError(f"{where}[{i}]: max_batch must increase strictly, got {b} after {prev}")
        out.append((int(b), int(k)))
        prev = int(b)
    return tuple(out)


def k_for_batch(schedule: Schedule, num_requests: int) -> int:
    """Draft tokens per request for a step that schedules ``num_requests`` requests."""
    for max_batch, k in schedule:
        if num_requests <= max_batch:
            return k
    return 0


class ScheduleSwitch:
    """A fixed schedule behind the same interface as the online switch (``sam_rollout.drafter.auto_switch.AutoSwitch``):
    it chooses from the batch size alone and learns nothing."""

    learns_acceptance = False

    def __init__(self, schedule: Schedule):
        self.schedule = schedule

    def choose_k(self, batch: int) -> int:
        return k_for_batch(self.schedule, batch)

    def observe_cost(self, batch: int, drafts_per_request: float, step_ms: float) -> None:
        pass

    def report(self) -> dict:
        return {"schedule": [list(pair) for pair in self.schedule]}


def threshold_schedule(threshold: int | None, k: int, max_batch: int) -> Schedule:
    """The fixed threshold as a schedule (``None`` = always speculate, up to ``max_batch``)."""
    if threshold is None:
        return ((max_batch, k),)
    if threshold < 1:
        return ((1, 0),)
    return ((threshold, k),)
