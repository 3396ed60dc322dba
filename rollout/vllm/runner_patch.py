"""Patches on vLLM's V1 model runner that give a SAM proposer request identity, finish events and
a metrics RPC. Idempotent; applied by ``SamProposer.__init__`` (inside the runner being built) and by
the plugin when the runner module is already imported.

All on ``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` (CPUModelRunner and vllm-ascend's
NPUModelRunner inherit them):

- ``propose_draft_token_ids``: if ``self.drafter`` has ``bind_step``, hand it
  ``(self.input_batch, scheduler_output)`` for the duration of the call (row i of the batch is
  request ``input_batch.req_ids[i]``).
- ``_on_request_state_removed``: call ``self.drafter.on_request_finished(req_id)`` for finished or
  aborted requests. vLLM 0.23 lacks that hook; there ``_update_states`` is wrapped instead and reads
  ``scheduler_output.finished_req_ids``.
- ``WorkerBase.sam_spec_metrics``: ``LLM.collective_rpc("sam_spec_metrics")`` returns each worker's
  stepper snapshot (None where no SAM proposer runs).
- ``WorkerBase.sam_spec_pause``: ``LLM.collective_rpc("sam_spec_pause", args=(True,))`` switches
  speculation off at run time (``False``: on again); returns whether the worker has a SAM proposer.
"""

from __future__ import annotations

import functools

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
_MARK = "__sam_spec_patched__"


def apply() -> bool:
    """Wrap the V1 model runner's hooks and add the metrics RPC. True if anything was patched now."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    if not hasattr(WorkerBase, "sam_spec_metrics"):
        WorkerBase.sam_spec_metrics = worker_sam_metrics
        WorkerBase.sam_spec_pause = worker_sam_pause
    return _patch_runner_class(GPUModelRunner)


def worker_sam_metrics(worker) -> dict | None:
    """The SAM stepper's snapshot on one worker, or None."""
    stepper = _stepper(worker)
    return None if stepper is None else stepper.snapshot()


def worker_sam_pause(worker, paused: bool) -> bool:
    """Pause (True) or resume the SAM stepper on one worker; False where no SAM proposer runs."""
    stepper = _stepper(worker)
    if stepper is not None:
        stepper.pause(paused)
    return stepper is not None


def _stepper(worker):
    runner = getattr(worker, "model_runner", None)
    drafter = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)  # V1 runner; Model Runner V2
    return getattr(drafter, "stepper", None)


def _patch_runner_class(cls) -> bool:
    if cls.__dict__.get(_MARK):
        return False
    cls.propose_draft_token_ids = _bind_step_around(cls.propose_draft_token_ids)
    if getattr(cls, "_on_request_state_removed", None) is not None:
        cls._on_request_state_removed = _finish_after(cls._on_request_state_removed)
    else:  # vLLM <= 0.23 has no finish hook: read finished ids from the scheduler output
        cls._update_states = _finish_before_update(cls._update_states)
    setattr(cls, _MARK, True)
    return True


def _bind_step_around(orig_propose):
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

    return propose_draft_token_ids


def _finish_after(orig_removed):
    @functools.wraps(orig_removed)
    def _on_request_state_removed(self, req_id, req_state):
        orig_removed(self, req_id, req_state)
        finished = getattr(getattr(self, "drafter", None), "on_request_finished", None)
        if finished is not None:
            finished(req_id)

    return _on_request_state_removed


def _finish_before_update(orig_update):
    @functools.wraps(orig_update)
    def _update_states(self, scheduler_output, *args, **kwargs):
        finished = getattr(getattr(self, "drafter", None), "on_request_finished", None)
        if finished is not None:
            for req_id in scheduler_output.finished_req_ids:
                finished(req_id)
        return orig_update(self, scheduler_output, *args, **kwargs)

    return _update_states
