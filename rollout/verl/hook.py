"""The Ray worker setup hook of the recipes: ``runtime_env.worker_process_setup_hook =
"rollout.verl.hook.install"``, run in every Ray worker process, the trainer's TaskRunner included.

No fork of verl; what it hooks:
- ``RolloutReplicaRegistry.register("vllm", loader)``: the trainer looks the replica class up by
  ``actor_rollout_ref.rollout.name`` when it builds its servers, so SAM's replica
  (``rollout.verl.replica.SamvLLMReplica``) serves under verl's own name;
- ``Tracking.log``: ``rollout.verl.tracking`` adds ``rollout/sam_*`` to every training step's metrics;
- the V1 trainer's checkpoint save and load: ``rollout.verl.checkpoint`` keeps the prompt stores.
Imports verl lazily and no vLLM (vLLM loads only when the replica class is asked for).
"""

from __future__ import annotations

from rollout.verl import checkpoint, tracking

REPLICA_NAME = "vllm"


def install() -> None:
    """Register the SAM replica, wrap verl's metrics logger and (once imported) its trainer's checkpoints."""
    register_replica()
    tracking.wrap()
    checkpoint.install()


def register_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(REPLICA_NAME, _load_sam_replica)


def _load_sam_replica():
    from rollout.verl.replica import SamvLLMReplica

    return SamvLLMReplica
