"""Patch ``ascend_ngram_route``: SAM on vllm-ascend through ``method="ngram"`` (docs/patches.md).

vllm-ascend (0.23 and main) never dispatches ``custom_class``, so SAM rides its n-gram route:

    speculative_config={"method": "ngram", "num_speculative_tokens": 3}
    additional_config={"sam_spec": {...}}     # presence of "sam_spec" selects SAM over n-gram

``apply()`` (``sam_rollout.patches``, as soon as ``vllm_ascend.worker.model_runner_v1`` is imported) patches
``NPUModelRunner._get_drafter`` to build a SAM subclass of vllm-ascend's n-gram proposer. Finished
requests reach it through vLLM's runner patch (``runner_hooks``), which NPUModelRunner inherits. The
contract is checked against the released vllm-ascend source by tests/test_ascend_contract.py; not run
on an NPU here. Details: docs/vllm-hooks.md.
"""

from __future__ import annotations

import logging

from sam_rollout.patches import replace

# The patch registry imports this module only once vllm-ascend's runner module is imported; SAM's
# drafter code (numba, through sam_rollout.stepper) is imported by apply().

RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"
NGRAM_MODULE = "vllm_ascend.spec_decode.ngram_proposer"
NAME = "ascend_ngram_route"

# under "vllm." so that vLLM's configured handler prints it in engine processes
logger = logging.getLogger(f"vllm.{__name__}")


def sam_requested(vllm_config) -> bool:
    from sam_rollout.settings import SETTINGS_KEY

    extra = getattr(vllm_config, "additional_config", None) or {}
    return isinstance(extra, dict) and SETTINGS_KEY in extra


def make_ngram_proposer_class(base):
    """A SAM proposer that *is a* ``base`` (an n-gram proposer class taking ``(vllm_config, runner)``).

    It skips ``base.__init__`` (the n-gram proposer allocates and JIT-warms buffers it would never
    use) and reads request identity from ``runner.input_batch``.
    """
    from sam_rollout.stepper import StepperAdapter

    class SamNgramProposer(StepperAdapter, base):  # type: ignore[misc, valid-type]
        def __init__(self, vllm_config, runner):
            self.runner = runner
            self.vllm_config = vllm_config
            self.set_up_stepper(vllm_config, logger, "SAM n-gram route proposer")
            self.k = self.settings.draft.k

        def load_model(self, *args, **kwargs):
            pass

        def dummy_run(self, *args, **kwargs):
            pass

        def propose(self, *args, **kwargs):
            # vLLM/vllm-ascend > 0.23: propose(K, sampled, num_tokens_no_spec, token_ids_cpu, ...)
            # vllm-ascend 0.23:        propose(sampled)   (vLLM 0.23: propose(sampled, ntns, tids, ...))
            if args and isinstance(args[0], int):
                k, sampled = args[0], args[1]
            else:
                k = kwargs.get("num_speculative_tokens")
                sampled = args[0] if args else kwargs["sampled_token_ids"]
            ib = self.runner.input_batch
            unsupported = getattr(ib, "spec_decode_unsupported_reqs", None)
            req_ids = ib.req_ids
            if unsupported:
                sampled = [[] if req_ids[i] in unsupported else s for i, s in enumerate(sampled)]
            return self.stepper.step(
                req_ids,
                ib.num_prompt_tokens,
                sampled,
                ib.num_tokens_no_spec,
                ib.token_ids_cpu,
                num_scheduled_reqs=len(sampled),
                k=k,
            )

    SamNgramProposer.__qualname__ = SamNgramProposer.__name__ = f"Sam{base.__name__}"
    return SamNgramProposer


def apply() -> bool:
    """Patch vllm-ascend's runner to build the SAM proposer for method="ngram" + sam_spec; False if it
    already does."""
    from vllm_ascend.spec_decode.ngram_proposer import AscendNgramProposer
    from vllm_ascend.worker import model_runner_v1 as mr

    sam_cls = make_ngram_proposer_class(AscendNgramProposer)

    def building_sam(original):
        def _get_drafter(self):
            spec = self.speculative_config
            if spec is not None and spec.method == "ngram" and sam_requested(self.vllm_config):
                return sam_cls(self.vllm_config, self)
            return original(self)

        return _get_drafter

    return replace(mr.NPUModelRunner, "_get_drafter", building_sam, NAME)
