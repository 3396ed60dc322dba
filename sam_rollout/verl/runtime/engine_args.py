"""SAM's vLLM engine kwargs as verl passes them (``actor_rollout_ref.rollout.engine_kwargs.vllm``).

Pure functions (no verl, no vLLM), shared by the server (``sam_rollout.verl.runtime.replica``) and the
launcher's early checks (``sam_rollout.verl.launcher.launch``), so a bad setting fails the same way in both.

SAM has three forms here: vLLM's ``custom_class`` with ``sam_rollout.proposer.SamProposer`` (vLLM 0.23
to 0.32), the registered method ``sam`` (vLLM >= 0.34), and vllm-ascend's ``ngram`` with
``additional_config.sam_spec`` (``sam_rollout.ascend.ngram_route``). Which of the first two the installed
vLLM has is ``sam_rollout.vllm.routes``' business (which ``sam_rollout.verl`` does not import); the refusal
(``sam_rollout.engine_kwargs.refusal``) names the version and the other route.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sam_rollout.engine_kwargs import CUSTOM_CLASS, SAM_PROPOSER, SETTINGS_KEY, refusal, requested_route
from sam_rollout.settings import SamSettings

ASCEND_DEVICE = "npu"
ASCEND_METHOD = "ngram"


def sam_requested(engine_kwargs: Mapping[str, Any]) -> bool:
    """True when the vLLM engine kwargs ask for SAM (any of its three forms)."""
    spec = engine_kwargs.get("speculative_config") or {}
    if requested_route(spec) is not None:
        return True
    extra = engine_kwargs.get("additional_config") or {}
    return spec.get("method") == ASCEND_METHOD and SETTINGS_KEY in extra


def check_sam_engine_kwargs(engine_kwargs: Mapping[str, Any]) -> SamSettings | None:
    """SamSettings of the request (raises ValueError naming the bad setting), None without SAM."""
    if not sam_requested(engine_kwargs):
        return None

    spec = engine_kwargs["speculative_config"]
    extra = engine_kwargs.get("additional_config") or {}
    return SamSettings.from_mapping(spec.get("num_speculative_tokens"), extra.get(SETTINGS_KEY))


def check_route(engine_kwargs: Mapping[str, Any], vllm_version: str, routes: frozenset[str]) -> None:
    """Raise ValueError if the kwargs ask for a SAM route that this vLLM (``vllm_version``, offering
    ``routes``, as ``sam_rollout.vllm.routes.available_routes()`` finds them) lacks, naming what to use instead."""
    message = refusal(vllm_version, routes, requested_route(engine_kwargs.get("speculative_config") or {}))
    if message is not None:
        raise ValueError(message)


def route_sam_engine_kwargs(engine_kwargs: dict, device: str) -> None:
    """Validate SAM's settings and fit them to ``device``, in place.

    GPU: the route asked for, ``custom_class`` or method ``sam`` (vLLM refuses the one it lacks when
    it builds the engine config: ``sam_rollout.vllm.routes``); the Ascend form there becomes
    ``custom_class``. NPU: vllm-ascend does not dispatch ``custom_class``, so ``method: ngram`` plus
    ``additional_config.sam_spec``, which ``sam_rollout.ascend.ngram_route`` turns into SAM inside
    vllm-ascend's runner.
    """
    if check_sam_engine_kwargs(engine_kwargs) is None:
        return
    spec = dict(engine_kwargs["speculative_config"])
    extra = dict(engine_kwargs.get("additional_config") or {})
    if device == ASCEND_DEVICE:
        spec.pop("model", None)
        spec["method"] = ASCEND_METHOD
    elif requested_route(spec) is None:  # the Ascend form on a GPU
        spec["method"] = CUSTOM_CLASS
        spec["model"] = SAM_PROPOSER
    extra.setdefault(SETTINGS_KEY, {})
    engine_kwargs["speculative_config"] = spec
    engine_kwargs["additional_config"] = extra
