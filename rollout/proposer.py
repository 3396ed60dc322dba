"""The public path of the vLLM proposer: ``speculative_config.model = "rollout.proposer.SamProposer"``."""

from rollout.vllm.proposer import SamProposer

__all__ = ["SamProposer"]
