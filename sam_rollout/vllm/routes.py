"""Which of SAM's vLLM routes the installed vLLM has, and a refusal at engine start where SAM cannot run.

- ``custom_class`` (vLLM 0.23 to 0.32, V1 model runner): ``sam_rollout.proposer.SamProposer``, drafting on
  the host after each step (vLLM turns async scheduling off for it).
- method ``sam`` (vLLM >= 0.34, Model Runner V2): ``sam_rollout.vllm.speculator``, registered by the plugin.
- ``speculator`` (vLLM 0.26): the same speculator through ``custom_class``, its model
  ``sam_rollout.vllm.speculator.RegisteredSamSpeculator``; the plugin's patches (``sam_rollout.vllm.v026``)
  give it Model Runner V2 and async scheduling.

Both read ``additional_config.sam_spec``. A config that asks for a route this vLLM lacks fails when the
engine config is built (``EngineArgs.create_engine_config``), naming the version and what to use; on
the ``sam`` route, a platform whose model runner never builds the speculator fails when the worker
starts (the patches ``route_check_engine_start`` and ``route_check_worker_start``, docs/patches.md).
Imports no SAM code (no numba): the plugin loads it in every vLLM process.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

from sam_rollout.engine_kwargs import (  # the routes as the engine arguments ask for them (imports nothing)
    CUSTOM_CLASS,
    SAM_METHOD,
    SAM_SPECULATOR,
    SPECULATOR,
    SPECULATOR_VERSIONS,
    USE_CUSTOM_CLASS,
    refusal,
    requested_route,
)
from sam_rollout.patches import CPU, GPU, NPU, in_range, installed_version, replace

REGISTRY_MODULE = "vllm.v1.worker.gpu.spec_decode.speculator_config"  # register_speculative_method (>= 0.34)
CUSTOM_CLASS_MODULE = "vllm.v1.spec_decode.custom_class_proposer"  # create_custom_proposer (0.23 to 0.32)


def available_routes() -> frozenset[str]:
    """The SAM routes this vLLM offers: ``sam``, ``custom_class``, ``speculator``."""
    routes = set()
    registry = importlib.util.find_spec(REGISTRY_MODULE)
    if registry is not None and hasattr(importlib.import_module(REGISTRY_MODULE), "register_speculative_method"):
        routes.add(SAM_METHOD)
    if importlib.util.find_spec(CUSTOM_CLASS_MODULE) is not None:
        routes.add(CUSTOM_CLASS)
        if in_range(installed_version("vllm"), SPECULATOR_VERSIONS):
            routes.add(SPECULATOR)
    return frozenset(routes)


def platform_kind() -> str:
    """This vLLM process's platform, as the patch registry names platforms."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return CPU
    return NPU if getattr(current_platform, "device_type", None) == NPU else GPU


def _vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


def check_route_at_engine_start() -> bool:
    """Check the SAM route when vLLM builds an engine config (front end, every version); False if
    ``EngineArgs.create_engine_config`` already does."""
    from vllm.engine.arg_utils import EngineArgs

    return replace(EngineArgs, "create_engine_config", _refusing_missing_route, "route_check_engine_start")


def _refusing_missing_route(original):
    @functools.wraps(original)
    def create_engine_config(self, *args, **kwargs):
        message = refusal(_vllm_version(), available_routes(), requested_route(self.speculative_config))
        if message is not None:
            raise ValueError(message)
        return original(self, *args, **kwargs)

    return create_engine_config


def refuse_bypassing_runner() -> None:
    """Front end, when a ``sam`` config is built: vLLM 0.34's standalone CPU model runner (non-x86 CPUs
    without Triton) runs without any speculator."""
    from vllm.platforms import current_platform

    uses_standalone = getattr(current_platform, "uses_standalone_cpu_model_runner", None)
    if uses_standalone is not None and uses_standalone():
        raise ValueError(
            f"SAM cannot run on vLLM {_vllm_version()} on this CPU: its standalone CPU model runner (non-x86, "
            "no Triton) builds no speculator. Use an x86 CPU or a GPU with method 'sam', or vLLM 0.23 to 0.32 "
            f"with {USE_CUSTOM_CLASS}."
        )


def uses_sam_speculator(speculative_config) -> bool:
    """Whether a vLLM ``SpeculativeConfig`` runs SAM's Model Runner V2 speculator: method ``sam`` (vLLM >=
    0.34, moved to ``custom_method``) or the ``speculator`` route's custom_class (vLLM 0.26)."""
    if getattr(speculative_config, "custom_method", None) == SAM_METHOD:
        return True
    return (
        getattr(speculative_config, "method", None) == CUSTOM_CLASS
        and getattr(speculative_config, "model", None) == SAM_SPECULATOR
    )


def check_runner_built_speculator(worker) -> None:
    """After a worker built its model runner: with SAM's speculator (method ``sam``, or the ``speculator``
    route), the runner must hold it (None on pipeline ranks that do not draft). A platform runner that
    builds none would serve without SAM while the scheduler still schedules draft slots."""
    spec = getattr(getattr(worker, "vllm_config", None), "speculative_config", None)
    if not uses_sam_speculator(spec):
        return
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        return
    speculator = getattr(runner, "speculator", "absent")
    if speculator is None or hasattr(speculator, "stepper"):
        return
    raise RuntimeError(
        f"SAM cannot run on vLLM {_vllm_version()} with {type(runner).__module__}.{type(runner).__qualname__}: "
        f"this platform's model runner bypasses vLLM's speculator interface (its speculator: "
        f"{speculator if isinstance(speculator, str) else type(speculator).__qualname__}). On Ascend use "
        "vllm-ascend with method 'ngram' and additional_config.sam_spec; elsewhere vLLM 0.23 to 0.32 with "
        f"{USE_CUSTOM_CLASS}."
    )


def check_runner_at_worker_start() -> bool:
    """Run ``check_runner_built_speculator`` right after each worker's ``init_device`` (vLLM >= 0.26);
    False if it already runs."""
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    return replace(WorkerWrapperBase, "init_device", _checking_runner, "route_check_worker_start")


def _checking_runner(original):
    @functools.wraps(original)
    def init_device(self):
        original(self)
        check_runner_built_speculator(self.worker)

    return init_device
