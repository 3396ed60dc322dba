"""One drafting step over an engine's persistent batch: the engine-free part of every SAM proposer.

An engine adapter (``rollout.vllm.proposer``, ``rollout.ascend.ngram_route``) hands ``SamStepper.step``
its batch arrays as they are, row i being request ``req_ids[i]``, after the step's accepted tokens were
written, and returns the drafts it gets back. The stepper starts new requests from their prompt
(GRPO siblings grouped by prompt tokens), measures last step's acceptance, feeds every row's
committed tokens to the drafter (also when speculation is off) and proposes where the switch allows.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections.abc import Sequence

import numpy as np

from rollout.metrics import SamMetrics
from rollout.settings import SamSettings
from sam import BatchDrafter
from sam.switch import k_for_batch, threshold_schedule


def prompt_group_key(prompt: np.ndarray) -> tuple[int, bytes]:
    """GRPO siblings share the prompt token ids; hash them to a group key."""
    p = np.ascontiguousarray(prompt, dtype=np.int64)
    return (int(p.shape[0]), hashlib.blake2b(p.tobytes(), digest_size=16).digest())


class SamStepper:
    """One drafting step over an engine's persistent batch.

    ``step`` takes the engine's arrays as they are (row i = request req_ids[i]) and returns one
    list per row: ``[]`` for rows without a sampled token this step (partial prefill) or when the
    switch turns speculation off, else at most ``k`` draft tokens.
    """

    def __init__(self, settings: SamSettings, max_model_len: int, log: logging.Logger | None = None):
        self.settings = settings
        self.k = settings.k
        # One switch for both settings: a threshold t is the schedule [[t, k]].
        self.schedule = settings.schedule or threshold_schedule(settings.threshold, self.k, sys.maxsize)
        self.max_model_len = int(max_model_len)
        self.drafter = BatchDrafter(settings.draft_config())
        self.metrics = SamMetrics(self.k)
        self._pending: dict = {}  # req_id -> (num_tokens when drafted, draft length)
        self._log = log or logging.getLogger(__name__)
        self._last_log = time.monotonic()

    # -- life cycle --------------------------------------------------------------------------
    def finish(self, req_id) -> None:
        self._pending.pop(req_id, None)
        if req_id in self.drafter:
            self.drafter.finish(req_id)
            self.metrics.finished += 1

    def k_now(self, num_scheduled_reqs: int) -> int:
        """Draft tokens per request for a step scheduling this many requests (schedule or threshold)."""
        return k_for_batch(self.schedule, num_scheduled_reqs)

    def step(
        self,
        req_ids: Sequence,
        num_prompt_tokens: np.ndarray,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        num_scheduled_reqs: int | None = None,
        k: int | None = None,
    ) -> list[list[int]]:
        """Drafts for each live row. ``num_scheduled_reqs`` (default: the live rows) keys the switch;
        ``k`` (default settings.k) caps the draft length, e.g. an engine's own per-step K."""
        t0 = time.perf_counter()
        n = len(sampled_token_ids)
        out: list[list[int]] = [[] for _ in range(n)]
        if n == 0:
            return out
        if len(req_ids) < n:
            raise RuntimeError(f"SAM proposer: {len(req_ids)} request ids for {n} batch rows")
        req_ids = list(req_ids[:n])
        lengths = np.asarray(num_tokens_no_spec[:n], dtype=np.int64)
        self._start_new(req_ids, num_prompt_tokens, token_ids_cpu)
        self._measure_acceptance(req_ids, sampled_token_ids, lengths)
        try:  # every row's committed tokens (accepted + bonus), also when speculation is off
            self.drafter.sync(req_ids, token_ids_cpu[:n], lengths)
        except ValueError as e:  # a row shorter than what the drafter saw: rebuild those requests
            self._resync(req_ids, num_prompt_tokens, token_ids_cpu, lengths, e)

        m = self.metrics
        m.calls += 1
        kk = self.k if k is None else min(int(k), self.k)
        kk = min(kk, self.k_now(n if num_scheduled_reqs is None else int(num_scheduled_reqs)))
        decode_rows = [i for i in range(n) if len(sampled_token_ids[i]) > 0]
        m.decode_row_steps += len(decode_rows)
        m.steps += bool(decode_rows)
        if kk > 0 and decode_rows:
            m.steps_on += 1
            self._propose(req_ids, decode_rows, lengths, kk, out)
        self._account_time(time.perf_counter() - t0)
        return out

    # -- the parts of a step -----------------------------------------------------------------
    def _start_new(self, req_ids, num_prompt_tokens, token_ids_cpu) -> None:
        """New requests start from their prompt, grouped by prompt tokens."""
        d = self.drafter
        for i, rid in enumerate(req_ids):
            if rid not in d:
                self._start(rid, token_ids_cpu[i, : int(num_prompt_tokens[i])])
                self.metrics.started += 1

    def _start(self, req_id, prompt: np.ndarray) -> None:
        self.drafter.start(req_id, prompt, group=prompt_group_key(prompt) if self.settings.group_aware else None)

    def _measure_acceptance(self, req_ids, sampled_token_ids, lengths) -> None:
        """Last step's drafts: how far did each drafted row advance (before the new tokens are synced)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        m = self.metrics
        for i, rid in enumerate(req_ids):
            p = pending.get(rid)
            if p is None or not sampled_token_ids[i]:
                continue
            accepted = min(max(int(lengths[i]) - p[0] - 1, 0), p[1])
            m.num_measured_drafts += 1
            m.num_accepted_tokens += accepted
            m.accepted_per_pos[:accepted] += 1

    def _resync(self, req_ids, num_prompt_tokens, token_ids_cpu, lengths, err) -> None:
        d = self.drafter
        rebuilt = 0
        for i, rid in enumerate(req_ids):
            if d.num_tokens(rid) > int(lengths[i]):
                d.finish(rid)
                self._start(rid, token_ids_cpu[i, : int(num_prompt_tokens[i])])
                rebuilt += 1
        if not rebuilt:
            raise err
        self._log.warning("SAM proposer: rebuilt %d request(s) whose rows went backwards (%s)", rebuilt, err)
        d.sync(req_ids, token_ids_cpu[: len(req_ids)], lengths)

    def _propose(self, req_ids, decode_rows, lengths, k: int, out) -> None:
        rows = np.asarray(decode_rows, dtype=np.int64)
        # never draft past max_model_len (same rule as vLLM's ngram proposer)
        room = np.maximum(np.minimum(self.max_model_len - lengths[rows], k), 0)
        proposal = self.drafter.propose([req_ids[i] for i in decode_rows], k)
        draft_lengths = np.minimum(proposal.lengths.astype(np.int64), room)
        m = self.metrics
        for j, i in enumerate(decode_rows):
            length = int(draft_lengths[j])
            if length > 0:
                out[i] = proposal.tokens[j, :length].tolist()
                self._pending[req_ids[i]] = (int(lengths[i]), length)
                m.num_drafts += 1
                m.num_draft_tokens += length

    def _account_time(self, seconds: float) -> None:
        m = self.metrics
        m.drafter_seconds += seconds
        if m.calls == 1:
            m.first_call_seconds = seconds
        if self.settings.log_interval_s and time.monotonic() - self._last_log >= self.settings.log_interval_s:
            self._last_log = time.monotonic()
            self._log.info("SAM proposer metrics: %s", m.as_dict())

    def snapshot(self) -> dict:
        """Cumulative metrics plus what the drafter holds now (what ``sam_spec_metrics`` returns)."""
        out = self.metrics.as_dict()
        out["live_requests"] = len(self.drafter)
        out["drafter_nbytes"] = int(self.drafter.nbytes)
        return out
