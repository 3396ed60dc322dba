"""The Ray worker setup hook of the recipes: ``runtime_env.worker_process_setup_hook =
"sam_rollout.verl.runtime.hook.install"``, run in every Ray worker process, the trainer's TaskRunner included.

No fork of verl; what it hooks:
- ``RolloutReplicaRegistry.register("vllm", loader)``: the trainer looks the replica class up by
  ``actor_rollout_ref.rollout.name`` when it builds its servers, so SAM's replica
  (``sam_rollout.verl.runtime.replica.SamvLLMReplica``) serves under verl's own name;
- ``Tracking.log``: ``sam_rollout.verl.runtime.tracking`` adds ``rollout/sam_*`` to every training step's metrics;
- the V1 trainer's checkpoint save and load: ``sam_rollout.verl.runtime.checkpoint`` keeps the prompt stores.
- the transfer queue's torch threads (``TQ_NUM_THREADS``): no more than the host's physical cores.
Imports verl lazily and no vLLM (vLLM loads only when the replica class is asked for).
"""

from __future__ import annotations

import os

from sam_rollout.verl.runtime import checkpoint, tracking

REPLICA_NAME = "vllm"
TRANSFER_QUEUE_THREADS_ENV = "TQ_NUM_THREADS"  # read once, when transfer_queue is imported (default 8)
TRANSFER_QUEUE_DEFAULT_THREADS = 8


def install() -> None:
    """Register the SAM replica, wrap verl's metrics logger and (once imported) its trainer's checkpoints."""
    fit_transfer_queue_threads()
    register_replica()
    tracking.wrap()
    checkpoint.install()


def register_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(REPLICA_NAME, _load_sam_replica)


def _load_sam_replica():
    from sam_rollout.verl.runtime.replica import SamvLLMReplica

    return SamvLLMReplica


def fit_transfer_queue_threads() -> None:
    """verl's transfer queue gives torch TQ_NUM_THREADS threads for every put and get; on a host with
    fewer physical cores it warns each time and uses the cores. Ask for the cores in the first place."""
    import psutil

    cores = psutil.cpu_count(logical=False) or 1
    if cores < TRANSFER_QUEUE_DEFAULT_THREADS:
        os.environ.setdefault(TRANSFER_QUEUE_THREADS_ENV, str(cores))
