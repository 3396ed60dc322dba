"""The ``sam`` speculative method's config for vLLM >= 0.34 (``register_speculative_method``).

vLLM imports this module by name in every process that builds a ``SpeculativeConfig`` with
``method="sam"`` (the front end included), so it imports only vLLM's light config module: no SAM
kernels, no numba, no model-runner code. The speculator itself is ``sam_rollout.vllm.speculator``.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

from sam_rollout.vllm.routes import SAM_METHOD, refuse_bypassing_runner

SPECULATOR_CLASS = "sam_rollout.vllm.speculator.RegisteredSamSpeculator"


class SamSpeculatorConfig(SpeculatorConfig):
    """No draft model (the target's config stands in, as for ngram and suffix), no hidden states, no
    draft logits. The token history stays where vLLM keeps it by default (UVA: pinned host memory
    mapped into the device), which is the cheaper side for a drafter that reads it on the host."""

    base_method = None  # not based on a built-in method
    speculator_class = SPECULATOR_CLASS
    adaptive_verification_uses_draft_logits = False

    @classmethod
    def configure(cls, spec) -> None:
        refuse_bypassing_runner()
        if spec.num_speculative_tokens is None:
            raise ValueError(f'speculative_config.num_speculative_tokens is required with method "{SAM_METHOD}"')
        if spec.enable_adaptive_verification:
            raise ValueError(
                f'speculative_config.enable_adaptive_verification is not supported with method "{SAM_METHOD}": '
                "SAM gives no per-slot confidences"
            )
        super().configure(spec)
