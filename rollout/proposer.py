"""SAM drafter as a vLLM speculative proposer.

Use it with::

    LLM(model, speculative_config={"method": "custom_class",
                                   "model": "rollout.proposer.SamProposer",
                                   "num_speculative_tokens": 3},
        additional_config={"sam_spec": {"threshold": 8, "min_match": 1}})

k is ``speculative_config.num_speculative_tokens``; every other setting lives in
``additional_config["sam_spec"]`` (see :class:`SamSettings`), validated when the engine starts.
From verl: ``+actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.sam_spec.threshold=8``.

vLLM's ``custom_class`` contract passes no request ids, so :mod:`rollout.plugin` wraps the model
runner's ``propose_draft_token_ids`` to hand this proposer the step's input batch (row -> request
id) and scheduler output, and ``_on_request_state_removed`` to free finished requests. The
proposer installs those patches itself when vLLM constructs it (idempotent), so it works with or
without the ``vllm.general_plugins`` entry point. See docs/vllm-hooks.md.

The engine-independent part is :class:`SamStepper`; the vllm-ascend route (:mod:`rollout.ascend`)
reuses it.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np

SETTINGS_KEY = "sam_spec"

logger = logging.getLogger(__name__)


def _get_logger():
    try:  # vLLM's logger is configured to print in engine processes
        from vllm.logger import init_logger

        return init_logger(__name__)
    except Exception:  # pragma: no cover
        return logger


# --------------------------------------------------------------------------------------------
# Settings: the one validated place
# --------------------------------------------------------------------------------------------

_DRAFT_FIELDS = ("min_match", "length_policy", "group_aware", "history_tokens")


@dataclass(frozen=True)
class SamSettings:
    """Engine-side SAM settings (``additional_config["sam_spec"]``).

    threshold: speculate only in steps whose number of scheduled requests (prefills included)
        is <= threshold; ``None`` = always. Drafter state is kept current either way.
    schedule: optional ``[[max_batch, k], ...]`` (strictly increasing max_batch, 0 <= k <= k of
        speculative_config): a step scheduling n requests drafts k tokens from the first pair with
        n <= max_batch, none above the last pair (``sam.switch``; e.g. from
        ``scripts/simulate_rollout.py``). When set, it replaces ``threshold``.
    min_match, length_policy, group_aware, history_tokens: passed to ``sam.DraftConfig``.
    log_interval_s: log the proposer's own metrics every this many seconds (0 = never).
    k is not a field here: it is ``speculative_config.num_speculative_tokens``.
    """

    k: int = 3
    threshold: int | None = 8
    min_match: int = 1
    length_policy: str = "fixed"
    group_aware: bool = True
    history_tokens: int = 0
    log_interval_s: float = 0.0
    schedule: tuple | None = None

    def __post_init__(self) -> None:
        where = f"additional_config.{SETTINGS_KEY}"
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"speculative_config.num_speculative_tokens must be an integer >= 1, got {self.k!r}")
        t = self.threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise ValueError(f"{where}.threshold must be an integer >= 0 or null, got {t!r}")
        if self.schedule is not None:  # normalise to a tuple of int pairs (hashable, frozen)
            from sam.switch import validate_schedule

            object.__setattr__(self, "schedule", validate_schedule(self.schedule, self.k, f"{where}.schedule"))
        li = self.log_interval_s
        if isinstance(li, bool) or not isinstance(li, (int, float)) or li < 0:
            raise ValueError(f"{where}.log_interval_s must be a number >= 0, got {li!r}")
        try:
            self.draft_config()
        except ValueError as e:  # DraftConfig names the field; say where it came from
            raise ValueError(f"{where}: {e}") from None

    def draft_config(self):
        from sam import DraftConfig

        return DraftConfig(k=self.k, **{f: getattr(self, f) for f in _DRAFT_FIELDS})

    @classmethod
    def from_mapping(cls, k: int, raw: Mapping[str, Any] | None) -> "SamSettings":
        where = f"additional_config.{SETTINGS_KEY}"
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where} must be a mapping, got {type(raw).__name__}")
        raw = dict(raw)
        if "k" in raw:
            raise ValueError(
                f"{where}.k is not a setting: k is speculative_config.num_speculative_tokens "
                f"(got {where}.k={raw['k']!r})"
            )
        known = {f.name for f in fields(cls)} - {"k"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
        if raw.get("schedule") is not None and raw.get("threshold") is not None:
            raise ValueError(
                f"{where}: set either threshold or schedule, not both (got threshold={raw['threshold']!r} "
                f"and schedule={raw['schedule']!r}); a threshold t is the schedule [[t, k]]"
            )
        return cls(k=k, **raw)

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "SamSettings":
        spec = vllm_config.speculative_config
        extra = getattr(vllm_config, "additional_config", None) or {}
        raw = extra.get(SETTINGS_KEY) if isinstance(extra, Mapping) else getattr(extra, SETTINGS_KEY, None)
        return cls.from_mapping(spec.num_speculative_tokens, raw)


# --------------------------------------------------------------------------------------------
# Metrics counted by the proposer itself
# --------------------------------------------------------------------------------------------


class SamMetrics:
    """Counters kept by the proposer (vLLM's own spec-decode counters stay authoritative).

    Acceptance is inferred from how far each drafted row advanced by the next call:
    accepted = min(new_tokens - 1, draft_len). Rows that leave the batch in between are not
    counted.
    """

    def __init__(self, k: int):
        self.k = k
        self.calls = 0  # proposer calls
        self.steps = 0  # calls with at least one decode row
        self.steps_on = 0  # of those, calls where speculation was on (threshold)
        self.drafter_seconds = 0.0
        self.first_call_seconds = 0.0  # includes numba compilation in a fresh process
        self.num_drafts = 0  # rows that received >= 1 draft token
        self.num_draft_tokens = 0
        self.num_measured_drafts = 0  # drafts whose outcome was observed
        self.num_accepted_tokens = 0
        self.accepted_per_pos = np.zeros(k, dtype=np.int64)
        self.decode_row_steps = 0  # decode rows seen (one per request per step)
        self.started = 0
        self.finished = 0

    def as_dict(self) -> dict:
        m = max(self.num_measured_drafts, 1)
        return {
            "calls": self.calls,
            "steps": self.steps,
            "steps_on": self.steps_on,
            "frac_steps_on": self.steps_on / self.steps if self.steps else 0.0,
            "drafter_ms_per_call": 1e3 * self.drafter_seconds / self.calls if self.calls else 0.0,
            "drafter_first_call_ms": 1e3 * self.first_call_seconds,
            "drafter_ms_per_call_after_first": (
                1e3 * (self.drafter_seconds - self.first_call_seconds) / (self.calls - 1) if self.calls > 1 else 0.0
            ),
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_measured_drafts": self.num_measured_drafts,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_acceptance_length": 1.0 + self.num_accepted_tokens / m if self.num_measured_drafts else 1.0,
            "acceptance_per_pos": (self.accepted_per_pos / m).tolist(),
            "decode_row_steps": self.decode_row_steps,
            "requests_started": self.started,
            "requests_finished": self.finished,
        }


def prompt_group_key(prompt: np.ndarray) -> tuple[int, bytes]:
    """GRPO siblings share the prompt token ids; hash them to a group key."""
    p = np.ascontiguousarray(prompt, dtype=np.int64)
    return (int(p.shape[0]), hashlib.blake2b(p.tobytes(), digest_size=16).digest())


# --------------------------------------------------------------------------------------------
# Engine-independent stepping
# --------------------------------------------------------------------------------------------


class SamStepper:
    """One drafting step over an engine's persistent batch.

    ``step`` takes the engine's arrays as they are (row i = request req_ids[i]) and returns one
    list per row: ``[]`` for rows without a sampled token this step (partial prefill) or when the
    threshold turns speculation off, else at most ``k`` draft tokens.
    """

    def __init__(self, settings: SamSettings, max_model_len: int, drafter=None):
        from sam.switch import threshold_schedule

        self.settings = settings
        self.k = settings.k
        # One switch for both settings: a threshold t is the schedule [[t, k]].
        self.schedule = settings.schedule or threshold_schedule(settings.threshold, self.k, sys.maxsize)
        self.max_model_len = int(max_model_len)
        if drafter is None:
            from sam import BatchDrafter

            drafter = BatchDrafter(settings.draft_config())
        self.drafter = drafter
        self.metrics = SamMetrics(self.k)
        self._pending: dict = {}  # req_id -> (num_tokens when drafted, draft length)
        self._log = _get_logger()
        self._last_log = time.monotonic()

    # -- life cycle --------------------------------------------------------------------------
    def finish(self, req_id) -> None:
        self._pending.pop(req_id, None)
        if req_id in self.drafter:
            self.drafter.finish(req_id)
            self.metrics.finished += 1

    def _resync(self, req_ids, num_prompt_tokens, token_ids_cpu, lengths, err) -> None:
        d = self.drafter
        rebuilt = 0
        for i, rid in enumerate(req_ids):
            if d.num_tokens(rid) > int(lengths[i]):
                d.finish(rid)
                npt = int(num_prompt_tokens[i])
                prompt = token_ids_cpu[i, :npt]
                d.start(rid, prompt, group=prompt_group_key(prompt) if self.settings.group_aware else None)
                rebuilt += 1
        if not rebuilt:
            raise err
        self._log.warning("SAM proposer: rebuilt %d request(s) whose rows went backwards (%s)", rebuilt, err)
        d.sync(req_ids, token_ids_cpu[: len(req_ids)], lengths)

    def speculate_now(self, num_scheduled_reqs: int) -> bool:
        return self.k_now(num_scheduled_reqs) > 0

    def k_now(self, num_scheduled_reqs: int) -> int:
        """Draft tokens per request for a step scheduling this many requests (schedule or threshold)."""
        from sam.switch import k_for_batch

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
        t0 = time.perf_counter()
        n = len(sampled_token_ids)
        out: list[list[int]] = [[] for _ in range(n)]
        if n == 0:
            return out
        if len(req_ids) < n:
            raise RuntimeError(f"SAM proposer: {len(req_ids)} request ids for {n} batch rows")
        req_ids = list(req_ids[:n])
        lengths = np.asarray(num_tokens_no_spec[:n], dtype=np.int64)
        m = self.metrics
        d = self.drafter

        # 1. new requests: start them from their prompt, grouped by prompt tokens
        for i, rid in enumerate(req_ids):
            if rid not in d:
                npt = int(num_prompt_tokens[i])
                prompt = token_ids_cpu[i, :npt]
                group = prompt_group_key(prompt) if self.settings.group_aware else None
                d.start(rid, prompt, group=group)
                m.started += 1

        # 2. acceptance of last step's drafts (before the new tokens are synced)
        if self._pending:
            pending, self._pending = self._pending, {}
            for i, rid in enumerate(req_ids):
                p = pending.get(rid)
                if p is None or not sampled_token_ids[i]:
                    continue
                acc = min(max(int(lengths[i]) - p[0] - 1, 0), p[1])
                m.num_measured_drafts += 1
                m.num_accepted_tokens += acc
                m.accepted_per_pos[:acc] += 1

        # 3. feed every row's committed tokens (accepted + bonus) to the drafter, also when off
        try:
            d.sync(req_ids, token_ids_cpu[:n], lengths)
        except ValueError as e:  # a row shorter than what the drafter saw: rebuild those requests
            self._resync(req_ids, num_prompt_tokens, token_ids_cpu, lengths, e)

        # 4. propose for decode rows when the threshold allows
        nsched = n if num_scheduled_reqs is None else int(num_scheduled_reqs)
        m.calls += 1
        kk = self.k if k is None else min(int(k), self.k)
        kk = min(kk, self.k_now(nsched))  # the adaptive switch: threshold or schedule
        decode_rows = [i for i in range(n) if len(sampled_token_ids[i]) > 0]
        m.decode_row_steps += len(decode_rows)
        m.steps += bool(decode_rows)
        if kk > 0 and decode_rows:
            m.steps_on += 1
            rows = np.asarray(decode_rows, dtype=np.int64)
            # never draft past max_model_len (same rule as vLLM's ngram proposer)
            room = np.minimum(self.max_model_len - lengths[rows], kk)
            prop = d.propose([req_ids[i] for i in decode_rows], kk)
            drafts, dlen = prop[0], prop[1]  # sam.Proposal(tokens, lengths, match_lengths, sources)
            dlen = np.minimum(np.asarray(dlen, dtype=np.int64), np.maximum(room, 0))
            for j, i in enumerate(decode_rows):
                L = int(dlen[j])
                if L > 0:
                    out[i] = drafts[j, :L].tolist()
                    self._pending[req_ids[i]] = (int(lengths[i]), L)
                    m.num_drafts += 1
                    m.num_draft_tokens += L
        dt = time.perf_counter() - t0
        m.drafter_seconds += dt
        if m.calls == 1:
            m.first_call_seconds = dt
        if self.settings.log_interval_s and time.monotonic() - self._last_log >= self.settings.log_interval_s:
            self._last_log = time.monotonic()
            self._log.info("SAM proposer metrics: %s", m.as_dict())
        return out


# --------------------------------------------------------------------------------------------
# vLLM custom_class proposer
# --------------------------------------------------------------------------------------------


class SamProposer:
    """``speculative_config={"method": "custom_class", "model": "rollout.proposer.SamProposer"}``.

    Constructed by vLLM as ``SamProposer(vllm_config)`` inside the model runner; called once per
    step as ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)``
    after the runner's bookkeeping (token_ids_cpu rows already hold this step's accepted tokens).
    """

    def __init__(self, vllm_config):
        from rollout import plugin

        self.vllm_config = vllm_config
        self.settings = SamSettings.from_vllm_config(vllm_config)
        self.stepper = SamStepper(self.settings, vllm_config.model_config.max_model_len)
        self._input_batch = None
        self._scheduler_output = None
        plugin.apply_runner_patches()
        _get_logger().info("SAM proposer: %s", asdict(self.settings))

    # called by the runner patch in rollout.plugin around each propose
    def bind_step(self, input_batch, scheduler_output) -> None:
        self._input_batch = input_batch
        self._scheduler_output = scheduler_output

    def unbind_step(self) -> None:
        self._input_batch = None
        self._scheduler_output = None

    def on_request_finished(self, req_id) -> None:
        self.stepper.finish(req_id)

    def load_model(self, *args, **kwargs) -> None:  # the CPU runner calls it unconditionally
        pass

    @property
    def metrics(self) -> SamMetrics:
        return self.stepper.metrics

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs):
        ib = self._input_batch
        if ib is None:
            raise RuntimeError(
                "SamProposer.propose was called without the step context from rollout.plugin "
                "(the model runner's propose_draft_token_ids was not wrapped; this runner class "
                "overrides it). See docs/vllm-hooks.md."
            )
        so = self._scheduler_output
        nsched = len(so.num_scheduled_tokens) if so is not None else None
        k_step = getattr(so, "num_spec_tokens_to_schedule", None) if so is not None else None
        return self.stepper.step(
            ib.req_ids,
            ib.num_prompt_tokens,
            sampled_token_ids,
            num_tokens_no_spec,
            token_ids_cpu,
            num_scheduled_reqs=nsched,
            k=k_step,
        )


def worker_sam_metrics(worker) -> dict | None:
    """The proposer's metrics dict on one worker (``LLM.collective_rpc("sam_spec_metrics")``)."""
    runner = getattr(worker, "model_runner", None)
    drafter = getattr(runner, "drafter", None)
    stepper = getattr(drafter, "stepper", None)
    if stepper is None:
        return None
    out = stepper.metrics.as_dict()
    out["live_requests"] = len(stepper.drafter)
    out["drafter_nbytes"] = int(getattr(stepper.drafter, "nbytes", 0))
    return out
