"""Patches on vLLM's V1 model runner that give a SAM proposer request identity and finish events
(``runner_hooks``), and SAM's RPCs on vLLM's workers (``worker_rpcs``). Idempotent; applied by
``sam_rollout.patches.apply_patches`` (docs/patches.md).

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
- ``WorkerBase.sam_spec_save_prompt_store`` / ``sam_spec_load_prompt_store`` (``args=(path,)``): the
  prompt store to and from a file (docs/prompt-store.md). Every TP worker drafts alike and holds the
  same store, so the engine's first worker saves it and every worker loads it;
  ``sam_spec_clear_prompt_store`` empties it on every worker, which the caller does when only some of
  an engine's workers loaded the file (every worker must hold the same store to draft alike).
- ``WorkerBase.sam_spec_export_prompt_responses`` (``args=(keys_hex,)``) / ``sam_spec_import_prompt_responses``
  (``args=(wire,)``): a few prompts' responses out of the first worker's store and into every worker's
  (the router's store handoff, ``sam_rollout.verl.runtime.store_handoff``).
"""

from __future__ import annotations

import functools
import logging

from sam_rollout.patches import mark, replace

RUNNER_HOOKS = "runner_hooks"
WORKER_RPCS_PATCH = "worker_rpcs"

logger = logging.getLogger(__name__)


def patch_runner() -> bool:
    """Wrap the V1 model runner's hooks. True if anything was patched now."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return _patch_runner_class(GPUModelRunner)


def install_worker_rpcs() -> None:
    """SAM's collective RPCs on vLLM's worker base class (both routes: custom_class and method ``sam``)."""
    from vllm.v1.worker.worker_base import WorkerBase

    for name, rpc in WORKER_RPCS.items():
        if not hasattr(WorkerBase, name):
            setattr(WorkerBase, name, mark(rpc, None, WORKER_RPCS_PATCH))


def worker_sam_metrics(worker) -> dict | None:
    """The SAM stepper's snapshot on one worker, or None."""
    return _on_stepper(worker, lambda stepper: stepper.snapshot())


def worker_sam_pause(worker, paused: bool) -> bool:
    """Pause (True) or resume the SAM stepper on one worker; False where no SAM proposer runs."""
    adapter = _adapter(worker)
    if adapter is not None:
        adapter.pause(paused)
    return adapter is not None


def worker_sam_save_prompt_store(worker, path: str) -> dict | None:
    """Write the prompt store to `path` on the engine's first worker: what was written, or the error
    (never raised: a failed save must not stop the engine). None on other workers or without a store."""
    if not _first_worker(worker):
        return None
    return _on_stepper(worker, lambda stepper: _save_store(stepper.drafter.prompt_store, path))


def _save_store(store, path: str) -> dict | None:
    if store is None:
        return None
    try:
        file_bytes = store.save(path)
    except Exception as e:
        logger.error("SAM prompt store NOT saved to %s: %s: %s", path, type(e).__name__, e)
        return {"path": path, "error": f"{type(e).__name__}: {e}"}
    return {"path": path, "file_bytes": file_bytes, **_holdings(store)}


def worker_sam_load_prompt_store(worker, path: str) -> dict | None:
    """Replace the prompt store by the one saved at `path`: what it holds now, and `warning` (why it
    starts empty, or None). None without a prompt store."""

    def load(stepper):
        if stepper.drafter.prompt_store is None:
            return None
        warning = stepper.drafter.load_prompt_store(path)
        return {"path": path, "warning": warning, **_holdings(stepper.drafter.prompt_store)}

    return _on_stepper(worker, load)


def worker_sam_clear_prompt_store(worker) -> bool | None:
    """Replace the prompt store by an empty one (the engine's budget and cap); None without a store."""

    def clear(stepper):
        if stepper.drafter.prompt_store is None:
            return None
        from sam_rollout.drafter.prompt_store import PromptStore

        config = stepper.drafter.config
        stepper.drafter.prompt_store = PromptStore(config.prompt_store_bytes, config.prompt_store_tokens)
        return True

    return _on_stepper(worker, clear)


def worker_sam_export_prompt_responses(worker, keys_hex: list[str]) -> dict | None:
    """These prompts' stored responses (``encode_entries``' form) on the engine's first worker; None on
    other workers or without a store."""
    if not _first_worker(worker):
        return None
    from sam_rollout.drafter.prompt_store import encode_entries

    def export(stepper):
        store = stepper.drafter.prompt_store
        return None if store is None else encode_entries(store.export([bytes.fromhex(k) for k in keys_hex]))

    return _on_stepper(worker, export)


def worker_sam_import_prompt_responses(worker, wire: dict) -> int | None:
    """Add another engine's exported responses to this worker's store: the responses new to it; None
    without a store."""
    from sam_rollout.drafter.prompt_store import decode_entries

    def import_entries(stepper):
        store = stepper.drafter.prompt_store
        return None if store is None else store.import_entries(decode_entries(wire))

    return _on_stepper(worker, import_entries)


WORKER_RPCS = {
    "sam_spec_metrics": worker_sam_metrics,
    "sam_spec_pause": worker_sam_pause,
    "sam_spec_save_prompt_store": worker_sam_save_prompt_store,
    "sam_spec_load_prompt_store": worker_sam_load_prompt_store,
    "sam_spec_clear_prompt_store": worker_sam_clear_prompt_store,
    "sam_spec_export_prompt_responses": worker_sam_export_prompt_responses,
    "sam_spec_import_prompt_responses": worker_sam_import_prompt_responses,
}


def _adapter(worker):
    """The worker's SAM adapter (a ``StepperAdapter``), or None where no SAM proposer runs."""
    runner = getattr(worker, "model_runner", None)
    drafter = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)  # V1 runner; Model Runner V2
    return drafter if getattr(drafter, "stepper", None) is not None else None


def _on_stepper(worker, fn):
    """``fn(stepper)`` where the worker's SAM adapter drafts; None where no SAM proposer runs."""
    adapter = _adapter(worker)
    return None if adapter is None else adapter.with_stepper(fn)


def _first_worker(worker) -> bool:
    """Rank 0 of the engine (TP/PP) and of its data-parallel group: one file per replica."""
    data_parallel_rank = getattr(getattr(worker, "parallel_config", None), "data_parallel_rank", 0)
    return getattr(worker, "rank", 0) == 0 and data_parallel_rank == 0


def _holdings(store) -> dict:
    s = store.stats()
    return {"prompts": s.prompts, "responses": s.responses, "tokens": s.tokens, "evicted_prompts": s.evicted_prompts}


def _patch_runner_class(cls) -> bool:
    bound = replace(cls, "propose_draft_token_ids", _bind_step_around, RUNNER_HOOKS)
    if getattr(cls, "_on_request_state_removed", None) is not None:
        finished = replace(cls, "_on_request_state_removed", _finish_after, RUNNER_HOOKS)
    else:  # vLLM <= 0.23 has no finish hook: read finished ids from the scheduler output
        finished = replace(cls, "_update_states", _finish_before_update, RUNNER_HOOKS)
    return bound or finished


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
