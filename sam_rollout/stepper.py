"""One drafting step over an engine's persistent batch: the engine-free part of every SAM proposer.

An engine adapter (``sam_rollout.vllm.proposer``, ``sam_rollout.vllm.speculator``,
``sam_rollout.ascend.ngram_route``; each a ``StepperAdapter``, which sets its stepper up) hands ``SamStepper.step``
its batch arrays as they are, row i being request ``req_ids[i]``, after the step's accepted tokens were
written, and returns the drafts it gets back. The stepper starts new requests from their prompt
(GRPO siblings grouped by prompt tokens; a later turn or a resumed partial rollout in its trajectory's
group, ``sam_rollout.drafter.trajectories``), measures last step's acceptance, feeds every row's
committed tokens to the drafter (also when speculation is off) and proposes where the switch allows.
For the online switch it also scores full drafts (``sam_rollout.draft_scoring``), from which the switch
learns acceptance whether or not it drafts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from sam_rollout.draft_scoring import DraftScorer
from sam_rollout.drafter import BatchDrafter, Proposal
from sam_rollout.drafter.auto_switch import AutoSwitch
from sam_rollout.drafter.prompt_store import prompt_key
from sam_rollout.drafter.switch import ScheduleSwitch
from sam_rollout.drafter.trajectories import Trajectory, TrajectoryIndex
from sam_rollout.metrics import SamMetrics
from sam_rollout.settings import AUTO, SamSettings

NBYTES_EVERY = 64  # calls between two readings of the drafter's bytes (a sum over its automata)
# an interval between two calls spent more than this share inside the last call (numba compiling at a
# first use: seconds on a fresh machine) is not an engine step: the switch does not time it
OWN_TIME_SHARE = 0.5
COMPILE_STEPS = 32  # compile_kernels' session: several scoring rounds, plain, probing and drafted steps
# finished requests kept for a later turn or resume of their trajectory: a whole training step's
# trajectories on one engine (verl's DAPO recipe: 512 prompts x 16 responses, over every replica)
TRAJECTORIES = 8192


def compile_kernels(settings: SamSettings) -> float:
    """A short synthetic session through a throwaway stepper with these settings, so that numba compiles
    the kernels of an engine step (or loads them from its cache) before the engine serves: on a fresh
    machine that takes 18-20 s on 2 cores, which would otherwise stall the first rollout's first
    steps. Returns the seconds it took."""
    t0 = time.perf_counter()
    clock = [0.0]  # simulated: each engine step takes 50 ms, so that the switch times the steps
    width = (settings.draft.k + 1) * (COMPILE_STEPS + 16)  # every draft is accepted: rows grow by k + 1 a step
    st = SamStepper(settings, max_model_len=width, clock=lambda: clock[0])
    period = np.arange(5, 10, dtype=np.int32)
    prompts = [np.tile(period, 3), np.tile(period, 3), np.arange(20, 30, dtype=np.int32), np.tile(period, 2)]
    prompt_lengths = np.array([len(p) for p in prompts], dtype=np.int32)  # dtypes as in vLLM's input batch
    lengths = prompt_lengths.copy()
    rows = np.zeros((len(prompts), width), dtype=np.int32)
    for i, p in enumerate(prompts):
        rows[i, : len(p)] = p
    req_ids = ["a", "b", "c", "d"]  # a and b are siblings (one group)
    drafts: list[list[int]] = [[] for _ in prompts]
    for s in range(COMPILE_STEPS):
        if s == COMPILE_STEPS // 2:  # a finished request's response goes to its group and the history
            st.finish("d")
            req_ids[3], lengths[3], drafts[3] = "e", prompt_lengths[3], []
        sampled = []
        for i, draft in enumerate(drafts):  # the engine: drafts of the period accepted, then a bonus token
            n = int(lengths[i])
            new = [int(period[(n + j) % 5]) for j in range(len(draft) + 1)]
            rows[i, n : n + len(new)] = new
            lengths[i] = n + len(new)
            sampled.append(new)
        clock[0] += 0.05
        drafts = st.step(req_ids, prompt_lengths, sampled, lengths, rows)
    return time.perf_counter() - t0


@dataclass
class SentDrafts:
    """One step's drafts, by batch row: what the next step measures them against."""

    req_ids: list  # the step's rows
    tokens_then: list[int]  # each row's tokens when it drafted
    draft_lengths: list[int]  # each row's tokens sent (0: none)
    finished: set = field(default_factory=set)  # requests finished since: not measured


class SamStepper:
    """One drafting step over an engine's persistent batch.

    ``step`` takes the engine's arrays as they are (row i = request req_ids[i]) and returns one
    list per row: ``[]`` for rows without a sampled token this step (partial prefill) or when the
    switch turns speculation off, else at most ``k`` draft tokens.

    The switch sees every step: its batch, how long it took (from the start of the previous call to
    the start of this one, which spans the engine step that verified the previous drafts) and whether
    it was clean (no prefill in it); an interval spent mostly in the stepper itself is not timed. A
    switch that learns acceptance also gets the scoring rounds.
    """

    def __init__(
        self, settings: SamSettings, max_model_len: int, log: logging.Logger | None = None, clock=time.perf_counter
    ):
        self.settings = settings
        self._clock = clock  # seconds; the tests pass a simulated one
        self.k = settings.draft.k
        self.switch = AutoSwitch(self.k) if settings.switch == AUTO else ScheduleSwitch(settings.fixed_schedule())
        self.scorer = DraftScorer(self.k, self.switch.score_every) if self.switch.learns_acceptance else None
        self.max_model_len = int(max_model_len)
        self.drafter = BatchDrafter(settings.draft)
        # a trajectory's later requests join its group and its stored responses: nothing to join with neither
        keyed = settings.draft.group_aware or settings.draft.prompt_store
        # up to k tokens of a finished text may be past its stop (accepted drafts the engine drops)
        self._trajectories = TrajectoryIndex(TRAJECTORIES, dropped_tokens=self.k) if keyed else None
        self._trajectory_of: dict = {}  # live request -> its Trajectory
        self.metrics = SamMetrics(self.k)
        self._sent: SentDrafts | None = None  # the last step's drafts, measured at the next step
        self._started_batch: list | None = None  # a batch whose requests all started (none finished since)
        self._last_call = None  # perf_counter() at the start of the last call
        self._last_own_ms = 0.0  # how long the last call took
        self._last_draft_tokens = 0
        self._started_since_round = 0  # requests started since the last scoring round began
        self.paused = False  # speculation switched off at run time (pause)
        self._log = log or logging.getLogger(__name__)
        self._last_log = time.monotonic()

    # -- life cycle --------------------------------------------------------------------------
    def pause(self, paused: bool) -> None:
        """Switch speculation off (True) or on again while the engine runs. Paused, the stepper drafts
        nothing and its switch learns nothing, but every request's tokens still reach the drafter, so
        drafting resumes from the whole context: an A/B inside one engine (the demo's SAM-off arm)."""
        self.paused = bool(paused)
        self._sent = None
        self._last_call = None  # no step time across the boundary
        self._last_draft_tokens = 0
        if self.scorer is not None:
            self.scorer.discard_round()

    def finish(self, req_id) -> None:
        if self._sent is not None:
            self._sent.finished.add(req_id)
        self._started_batch = None
        if self.scorer is not None:
            self.scorer.drop(req_id)
        if req_id in self.drafter:
            finished = self.drafter.finish(req_id)
            trajectory = self._trajectory_of.pop(req_id)
            if self._trajectories is not None:
                self._trajectories.add(finished.prompt, finished.response, trajectory)
            self.metrics.finished += 1

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
        ``k`` (default settings.draft.k) caps the draft length, e.g. an engine's own per-step K."""
        t0 = self._clock()
        n = len(sampled_token_ids)
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        if n == 0:
            return out
        if len(req_ids) < n:
            raise RuntimeError(f"SAM proposer: {len(req_ids)} request ids for {n} batch rows")
        req_ids = list(req_ids[:n])
        lengths = np.asarray(num_tokens_no_spec[:n])  # any integer dtype: the drafter takes it as it is
        row_lengths = lengths.tolist()  # Python ints for the per-row work: numpy scalars cost more
        scheduled = n if num_scheduled_reqs is None else int(num_scheduled_reqs)
        decode_rows = [i for i, sampled in enumerate(sampled_token_ids) if len(sampled)]
        started = self._start_new(req_ids, num_prompt_tokens, token_ids_cpu)
        self._observe_last_step(req_ids, sampled_token_ids, row_lengths)
        if self.scorer is not None:
            self.scorer.resolve(req_ids, token_ids_cpu, row_lengths)
            self._started_since_round += started
        clean = started == 0 and len(decode_rows) == scheduled  # no prefill in the step
        if self._last_call is not None and clean and not self.paused:
            step_ms = 1e3 * (t0 - self._last_call)
            if self._last_own_ms < OWN_TIME_SHARE * step_ms:
                self.switch.observe_cost(scheduled, self._last_draft_tokens / scheduled, step_ms)
        m = self.metrics
        m.calls += 1
        m.decode_row_steps += len(decode_rows)
        m.steps += bool(decode_rows)
        self._last_draft_tokens = 0
        kk, rows, scored = 0, [], []
        if decode_rows and not self.paused:
            round_start = self._start_round_if_due(scheduled)  # the last round's counts first: k rests on them
            kk = self.switch.choose_k(scheduled)
            if k is not None:
                kk = min(kk, int(k))
            scored = self.scorer.rows_to_score(decode_rows, round_start) if self.scorer is not None else []
            if kk > 0:
                m.steps_on += 1
            rows = decode_rows if kk > 0 else scored
        # every row's committed tokens (accepted + bonus) reach the drafter, also when speculation is
        # off; then the drafts for `rows`, in the same compiled call
        proposal = self._sync_and_propose(req_ids, num_prompt_tokens, token_ids_cpu, lengths, rows, scored, kk)
        if rows:
            self._send(req_ids, rows, row_lengths, proposal, kk, out, scored)
        self._last_call = None if self.paused else t0
        if m.calls % NBYTES_EVERY == 0:
            m.peak_drafter_nbytes = max(m.peak_drafter_nbytes, self.drafter.nbytes)
        own = self._clock() - t0
        self._last_own_ms = 1e3 * own
        self._account_time(own)
        return out

    # -- the parts of a step -----------------------------------------------------------------
    def _start_new(self, req_ids, num_prompt_tokens, token_ids_cpu) -> int:
        """New requests start from their prompt, grouped by prompt tokens. Returns how many started."""
        if req_ids == self._started_batch:  # the usual step: last step's requests, none finished since
            return 0
        started = with_store = 0
        for i, rid in enumerate(req_ids):
            if rid not in self.drafter:
                with_store += self._start(rid, token_ids_cpu[i, : int(num_prompt_tokens[i])])
                started += 1
        self.metrics.started += started
        self.metrics.started_with_store += with_store
        self._started_batch = req_ids
        return started

    def _start(self, req_id, prompt: np.ndarray) -> bool:
        """Start a request; returns whether its trajectory's first request found stored responses."""
        continues = self._trajectories.find(prompt) if self._trajectories is not None else None
        if continues is None:
            # the prompt's key groups GRPO siblings, as it names the prompt in the store and the router
            group = prompt_key(prompt) if self.settings.draft.group_aware else None
            trajectory = Trajectory(len(prompt), group, self.drafter.start(req_id, prompt, group=group))
        else:  # a later turn or a resumed partial rollout: a prompt is its first prompt
            trajectory = continues.trajectory
            self.drafter.start(req_id, prompt, group=trajectory.group, continues=continues)
        self._trajectory_of[req_id] = trajectory
        return trajectory.with_store

    def _observe_last_step(self, req_ids, sampled_token_ids, row_lengths: list[int]) -> None:
        """How far each row drafted last step advanced (accepted tokens, then one from the target): the
        acceptance metrics. Rows without a sampled token this step are not measured."""
        sent, self._sent = self._sent, None
        if sent is None:
            return
        if req_ids == sent.req_ids and not sent.finished:  # the usual step: the same rows as last step
            then = zip(sent.tokens_then, sent.draft_lengths)
        else:  # rows moved, joined or left: each row finds its request's draft, if it had one
            where = {rid: (t, d) for rid, t, d in zip(sent.req_ids, sent.tokens_then, sent.draft_lengths) if d}
            for rid in sent.finished:
                where.pop(rid, None)
            then = (where.get(rid, (0, 0)) for rid in req_ids)
        self.metrics.count_accepted(
            [
                min(max(length - tokens_then - 1, 0), draft_length)
                for length, sampled, (tokens_then, draft_length) in zip(row_lengths, sampled_token_ids, then)
                if draft_length and len(sampled)
            ]
        )

    def _resync(self, req_ids, num_prompt_tokens, token_ids_cpu, lengths, err) -> None:
        d = self.drafter
        rebuilt = 0
        for i, rid in enumerate(req_ids):
            if d.num_tokens(rid) > int(lengths[i]):
                d.finish(rid, keep=False)  # not finished: its whole response is stored when it is
                self._start(rid, token_ids_cpu[i, : int(num_prompt_tokens[i])])
                rebuilt += 1
        if not rebuilt:
            raise err
        self._log.warning("SAM proposer: rebuilt %d request(s) whose rows went backwards (%s)", rebuilt, err)

    def _start_round_if_due(self, scheduled: int) -> bool:
        """On a step that starts a scoring round, the finished round (and a new batch, if one started)
        goes to the switch. Returns whether one started (never without a scorer)."""
        if self.scorer is None or not self.scorer.round_due():
            return False
        self.scorer.start_round(self.switch)
        if self._started_since_round:  # a new batch (the engine admits it over a few steps)
            self.switch.observe_new_requests(self._started_since_round, scheduled)
            self._started_since_round = 0
        return True

    def _sync_and_propose(self, req_ids, num_prompt_tokens, token_ids_cpu, lengths, rows, scored, k) -> Proposal:
        """Every row synced (row i for req_ids[i]; the rows past n unread), then drafts for `rows`: k
        tokens, or the full k of the settings where some rows are `scored`. A row shorter than what
        the drafter saw has its request rebuilt from its prompt first."""
        k_proposed = self.k if scored else k
        propose = None if rows == list(range(len(req_ids))) else rows  # None: every row, nothing to index
        try:
            return self.drafter.step(req_ids, token_ids_cpu, lengths, k_proposed, propose=propose)
        except ValueError as e:  # nothing was appended: rebuild those requests, then step again
            self._resync(req_ids, num_prompt_tokens, token_ids_cpu, lengths, e)
            return self.drafter.step(req_ids, token_ids_cpu, lengths, k_proposed, propose=propose)

    def _send(self, req_ids, rows, row_lengths: list[int], proposal: Proposal, k: int, out, scored: list[int]) -> None:
        """The drafts of ``rows`` (proposal row j for rows[j]), cut to k tokens, into ``out``; for the
        ``scored`` ones (a subset), the full drafts to the scorer as well, and the sent drafts are their
        first k tokens (one proposal a step). That prefix differs from a k-token proposal in a few percent
        of rows: the frequent continuation weighs the whole draft length."""
        full_lengths = proposal.lengths.tolist()
        if max(row_lengths) + proposal.tokens.shape[1] > self.max_model_len:  # rows near the end: cut there
            full_lengths = [min(n, max(self.max_model_len - row_lengths[i], 0)) for i, n in zip(rows, full_lengths)]
        if scored:
            self._score(req_ids, rows, row_lengths, proposal.tokens, full_lengths, set(scored))
        if k == 0:
            return
        draft_lengths = [0] * len(req_ids)
        for i, row_tokens, length in zip(rows, proposal.tokens[:, :k].tolist(), full_lengths):
            if length > 0:
                length = min(length, k)
                out[i] = row_tokens[:length]
                draft_lengths[i] = length
        self._sent = SentDrafts(req_ids, row_lengths, draft_lengths)
        draft_tokens = sum(draft_lengths)
        self.metrics.num_drafts += len(draft_lengths) - draft_lengths.count(0)
        self.metrics.num_draft_tokens += draft_tokens
        self._last_draft_tokens = draft_tokens

    def _score(self, req_ids, rows, row_lengths: list[int], tokens: np.ndarray, full_lengths: list[int], scored: set):
        """The full drafts of the ``scored`` rows to the scorer, in row order."""
        for j, i in enumerate(rows):
            if i in scored:
                self.scorer.add(req_ids[i], row_lengths[i], tokens[j, : full_lengths[j]])

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
        out["peak_drafter_nbytes"] = max(self.metrics.peak_drafter_nbytes, out["drafter_nbytes"])
        out["switch"] = self.switch.report()
        store = self.drafter.prompt_store
        if store is not None:  # hits, misses, prompts, tokens, bytes (not in drafter_nbytes)
            out["prompt_store"] = store.stats().as_dict()
        return out


class StepperAdapter:
    """What every engine adapter does alike (the custom_class proposer, the vLLM 0.34 speculator, the
    vllm-ascend n-gram route): ``set_up_stepper`` from the engine's vLLM config, finished requests
    forwarded to the stepper, and the stepper's metrics."""

    settings: SamSettings
    stepper: SamStepper
    max_model_len: int

    def set_up_stepper(
        self,
        vllm_config,
        log: logging.Logger,
        name: str,
        check_settings: Callable[[SamSettings], None] | None = None,
        compile: bool = True,
    ) -> None:
        """The settings from ``vllm_config`` (duck-typed: ``speculative_config.num_speculative_tokens``,
        ``additional_config["sam_spec"]``, ``model_config.max_model_len``), validated once: a bad one
        raises ValueError naming it, and so does ``check_settings``, a route's own refusal. Then the
        stepper, logging to ``log``, and (unless ``compile`` is False) its kernels compiled before the
        engine serves, not inside the first rollout's steps; ``log`` says "<name>: <settings>; kernels
        ready in N s"."""
        self.settings = SamSettings.from_vllm_config(vllm_config)
        if check_settings is not None:
            check_settings(self.settings)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.stepper = SamStepper(self.settings, self.max_model_len, log=log)
        if compile:
            seconds = compile_kernels(self.settings)
            log.info("%s: %s; kernels ready in %.1f s", name, asdict(self.settings), seconds)

    def on_request_finished(self, req_id) -> None:
        self.stepper.finish(req_id)

    def with_stepper(self, fn: Callable[[SamStepper], object]):
        """``fn(stepper)``, where the adapter's drafting happens (SAM's RPCs reach the stepper this way:
        an adapter that drafts in a thread of its own runs it there)."""
        return fn(self.stepper)

    def pause(self, paused: bool) -> None:
        self.stepper.pause(paused)

    @property
    def metrics(self) -> SamMetrics:
        return self.stepper.metrics
