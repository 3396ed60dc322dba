"""SAM's vLLM engine kwargs as verl passes them (``actor_rollout_ref.rollout.engine_kwargs.vllm``).

Pure functions (no verl, no vLLM), shared by the server (``rollout.verl.replica``) and the
launcher's early checks (``rollout.verl.launch``), so a bad setting fails the same way in both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout.engine_kwargs import SAM_PROPOSER, SETTINGS_KEY
from rollout.settings import SamSettings

ASCEND_DEVICE = "npu"


def sam_requested(engine_kwargs: Mapping[str, Any]) -> bool:
    """True when the vLLM engine kwargs ask for SAM (either route)."""
    spec = engine_kwargs.get("speculative_config") or {}
    if spec.get("model") == SAM_PROPOSER:
        return True
    extra = engine_kwargs.get("additional_config") or {}
    return spec.get("method") == "ngram" and SETTINGS_KEY in extra


def check_sam_engine_kwargs(engine_kwargs: Mapping[str, Any]) -> SamSettings | None:
    """SamSettings of the request (raises ValueError naming the bad setting), None without SAM."""
    if not sam_requested(engine_kwargs):
        return None

    spec = engine_kwargs["speculative_config"]
    extra = engine_kwargs.get("additional_config") or {}
    return SamSettings.from_mapping(spec.get("num_speculative_tokens"), extra.get(SETTINGS_KEY))


def route_sam_engine_kwargs(engine_kwargs: dict, device: str) -> None:
    """Validate SAM's settings and fit them to ``device``, in place.

    GPU: vLLM's ``custom_class`` with ``rollout.proposer.SamProposer``. NPU: vllm-ascend does not
    dispatch ``custom_class``, so ``method: ngram`` plus ``additional_config.sam_spec``, which
    ``rollout.ascend.ngram_route`` turns into SAM inside vllm-ascend's runner.
    """
    if check_sam_engine_kwargs(engine_kwargs) is None:
        return
    spec = dict(engine_kwargs["speculative_config"])
    extra = dict(engine_kwargs.get("additional_config") or {})
    if device == ASCEND_DEVICE:
        spec.pop("model", None)
        spec["method"] = "ngram"
    else:
        spec["method"] = "custom_class"
        spec["model"] = SAM_PROPOSER
    extra.setdefault(SETTINGS_KEY, {})
    engine_kwargs["speculative_config"] = spec
    engine_kwargs["additional_config"] = extra
