"""SAM as a vLLM ``custom_class`` speculative proposer.

    LLM(model, speculative_config={"method": "custom_class", "model": "sam_rollout.proposer.SamProposer",
                                   "num_speculative_tokens": 3},
        additional_config={"sam_spec": {"switch": 8}})

(``sam_rollout.proposer.SamProposer`` is the public path; this module is where it lives.) vLLM builds it
as ``SamProposer(vllm_config)`` inside the model runner and calls ``propose`` once per step, after
the runner's bookkeeping. The custom_class contract passes no request ids, so the runner patch
(``sam_rollout.vllm.runner_patch``) binds each step's input batch and scheduler output to the proposer
and forwards finished requests. The proposer applies the vLLM patches itself (``sam_rollout.patches``), so
it works with or without the ``vllm.general_plugins`` entry point.
"""

from __future__ import annotations

from vllm.logger import init_logger

from sam_rollout.patches import apply_patches
from sam_rollout.stepper import StepperAdapter

# under "vllm." so that vLLM's configured handler prints it in engine processes
logger = init_logger(f"vllm.{__name__}")


class SamProposer(StepperAdapter):
    """``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` returns one
    draft list per input-batch row; ``[]`` where nothing is drafted."""

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self._input_batch = None
        self._scheduler_output = None
        self.set_up_stepper(vllm_config, logger, "SAM proposer")
        apply_patches("vllm")  # also without the plugin installed (verl workers on PYTHONPATH)

    # called by the runner patch around each propose
    def bind_step(self, input_batch, scheduler_output) -> None:
        self._input_batch = input_batch
        self._scheduler_output = scheduler_output

    def unbind_step(self) -> None:
        self._input_batch = None
        self._scheduler_output = None

    def load_model(self, *args, **kwargs) -> None:  # the CPU runner calls it unconditionally
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs):
        batch = self._input_batch
        if batch is None:
            raise RuntimeError(
                "SamProposer.propose was called without the step context from sam_rollout.vllm.runner_patch "
                "(the model runner's propose_draft_token_ids was not wrapped; this runner class "
                "overrides it). See docs/vllm-hooks.md."
            )
        so = self._scheduler_output
        return self.stepper.step(
            batch.req_ids,
            batch.num_prompt_tokens,
            sampled_token_ids,
            num_tokens_no_spec,
            token_ids_cpu,
            num_scheduled_reqs=len(so.num_scheduled_tokens) if so is not None else None,
            # the engine's own per-step K (num_speculative_tokens_per_batch_size), where it has one
            k=getattr(so, "num_spec_tokens_to_schedule", None) if so is not None else None,
        )
