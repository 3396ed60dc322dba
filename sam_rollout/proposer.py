"""The public path of the vLLM proposer: ``speculative_config.model = "sam_rollout.proposer.SamProposer"``."""

from sam_rollout.vllm.proposer import SamProposer

__all__ = ["SamProposer"]
