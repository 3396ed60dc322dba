"""Adapters between the SAM drafter (sam/) and inference engines (vLLM, vllm-ascend)."""
