"""vLLM 0.26: SAM's Model Runner V2 speculator through ``custom_class``, with async scheduling.

vLLM 0.26's Model Runner V2 already calls a speculator as 0.34 does (``BaseSpeculator.propose`` after the
step's tokens are in the request state), but has no registry: ``init_speculator`` knows only vLLM's own
methods, the config sends ``custom_class`` to the V1 runner, and async scheduling is turned off for it.
A ``custom_class`` config whose model is ``sam_rollout.vllm.speculator.RegisteredSamSpeculator`` (the
``speculator`` route, ``sam_rollout.engine_kwargs.USE_SPECULATOR``) is given, by these patches and for
that config only (every other config passes through untouched):

- ``v026_runner_support``, ``v026_runner_choice``: Model Runner V2 (``VllmConfig.use_v2_model_runner``; the
  method is dropped from what V2 lacks, so V2's own check still names anything else it lacks);
- ``v026_async_gate``: async scheduling, as vLLM keeps it for its GPU n-gram (``VllmConfig.__post_init__``
  reads the method against ``NgramGPUTypes``; during that call the name also lists ``custom_class``);
- ``v026_init_speculator``, ``v026_runner_state``: the runner builds SAM's speculator and hands it the
  request state (0.26 builds that after the speculator);
- ``v026_finished``: finished requests reach the speculator (0.34's ``on_requests_finished``);
- ``v026_warmup_reset``: after the warm-up requests the speculator forgets them (0.34's ``reset_state``).

Line numbers of what these wrap, in the 0.26.0 wheel: docs/vllm-hooks.md; contract:
tests/test_vllm026_contract.py.
"""

from __future__ import annotations

import functools
import sys
import typing

from sam_rollout.engine_kwargs import CUSTOM_CLASS, SAM_PROPOSER, SAM_SPECULATOR
from sam_rollout.patches import replace
from sam_rollout.vllm.routes import uses_sam_speculator

V2_LACKS_METHOD = f"speculative method '{CUSTOM_CLASS}'"  # what 0.26 lists for a custom_class config


class MarkedProperty(property):
    """A property that can carry the patch mark (``property`` objects take no attributes)."""


def support_on_runner_v2() -> bool:
    from vllm.config.vllm import VllmConfig

    return replace(VllmConfig, "_get_v2_model_runner_unsupported_features", _dropping_own_method, "v026_runner_support")


def choose_runner_v2() -> bool:
    from vllm.config.vllm import VllmConfig

    return replace(VllmConfig, "use_v2_model_runner", _runner_v2_for_sam, "v026_runner_choice")


def keep_async_scheduling() -> bool:
    from vllm.config.vllm import VllmConfig

    return replace(VllmConfig, "__post_init__", _async_like_ngram_gpu, "v026_async_gate")


def build_speculator() -> bool:
    import vllm.v1.worker.gpu.model_runner as model_runner

    return replace(model_runner, "init_speculator", _building_sam, "v026_init_speculator")


def hand_request_state() -> bool:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return replace(GPUModelRunner, "__init__", _handing_request_state, "v026_runner_state")


def report_finished() -> bool:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return replace(GPUModelRunner, "finish_requests", _reporting_finished, "v026_finished")


def reset_after_warmup() -> bool:
    import vllm.v1.worker.gpu_worker as gpu_worker

    return replace(gpu_worker, "warmup_kernels", _resetting_after, "v026_warmup_reset")


def _dropping_own_method(original):
    @functools.wraps(original)
    def _get_v2_model_runner_unsupported_features(self):
        lacks = original(self)
        if uses_sam_speculator(self.speculative_config):
            lacks = [item for item in lacks if item != V2_LACKS_METHOD]
        return lacks

    return _get_v2_model_runner_unsupported_features


def _runner_v2_for_sam(original: property) -> property:
    def use_v2_model_runner(self) -> bool:
        if not uses_sam_speculator(self.speculative_config):
            return original.fget(self)
        from vllm import envs

        if envs.VLLM_USE_V2_MODEL_RUNNER is False:
            raise ValueError(
                f"speculative_config.model={SAM_SPECULATOR} runs on Model Runner V2, and "
                f"VLLM_USE_V2_MODEL_RUNNER=0 asks for the V1 runner: unset it, or use model={SAM_PROPOSER} "
                "(the host-side proposer, on the V1 runner without async scheduling)"
            )
        return True

    return MarkedProperty(use_v2_model_runner, doc=original.__doc__)


def _async_like_ngram_gpu(original):
    @functools.wraps(original)
    def __post_init__(self):
        if not uses_sam_speculator(self.speculative_config):
            return original(self)
        module = sys.modules[original.__module__]
        ngram_gpu = module.NgramGPUTypes
        module.NgramGPUTypes = typing.Literal[(*typing.get_args(ngram_gpu), CUSTOM_CLASS)]
        try:
            return original(self)
        finally:
            module.NgramGPUTypes = ngram_gpu

    return __post_init__


def _building_sam(original):
    @functools.wraps(original)
    def init_speculator(vllm_config, device, *args, **kwargs):
        if not uses_sam_speculator(vllm_config.speculative_config):
            return original(vllm_config, device, *args, **kwargs)
        from sam_rollout.vllm.speculator import RegisteredSamSpeculator

        return RegisteredSamSpeculator(vllm_config, device, req_states=None)  # the runner hands it over next

    return init_speculator


def _sam_speculator(runner):
    speculator = getattr(runner, "speculator", None)
    return speculator if hasattr(speculator, "stepper") else None


def _handing_request_state(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        speculator = _sam_speculator(self)
        if speculator is not None:
            speculator.req_states = self.req_states

    return __init__


def _reporting_finished(original):
    @functools.wraps(original)
    def finish_requests(self, scheduler_output):
        speculator = _sam_speculator(self)
        if speculator is not None and scheduler_output.finished_req_ids:  # while their tokens are readable
            speculator.on_requests_finished(scheduler_output.finished_req_ids)
        return original(self, scheduler_output)

    return finish_requests


def _resetting_after(original):
    @functools.wraps(original)
    def warmup_kernels(model_runner, *args, **kwargs):
        out = original(model_runner, *args, **kwargs)
        speculator = _sam_speculator(model_runner)
        if speculator is not None:
            speculator.reset_state()
        return out

    return warmup_kernels
