"""verl's real ``vLLMHttpServer.launch_server`` run up to where it would start vLLM, for tests and evals:
the vLLM arguments verl builds from a rollout config (imports verl and vLLM)."""

from __future__ import annotations

import asyncio
import types


def launch_server_args(rollout_cfg, *, replica_rank=0, model_path="/unused", gpus_per_node=16, **rollout_fields):
    """(vLLM's parsed arguments, verl's RolloutConfig) from our server class's ``launch_server``.
    rollout_fields: RolloutConfig fields the YAML schema does not expose (e.g. enable_sleep_mode)."""
    from omegaconf import open_dict
    from verl.utils.config import omega_conf_to_dataclass

    from sam_rollout.verl.runtime import replica

    server = object.__new__(replica.SamvLLMHttpServer)  # no Ray actor, no devices: set what launch_server reads
    with open_dict(rollout_cfg):
        rollout_cfg.update(rollout_fields)
    server.config = omega_conf_to_dataclass(rollout_cfg)
    server.model_config = types.SimpleNamespace(
        local_path=model_path, trust_remote_code=False, lora={}, lora_rank=0, hf_config=types.SimpleNamespace()
    )
    server.replica_rank, server.node_rank, server.nnodes, server.gpus_per_node = replica_rank, 0, 1, gpus_per_node
    server.workers = [None] * server.config.tensor_model_parallel_size
    server._disaggregation_role = "null"
    server.profiler_controller = types.SimpleNamespace(check_enable=lambda: False)
    captured = {}

    async def run_server(args):
        captured["args"] = args

    server.run_server = run_server
    asyncio.run(server.launch_server())
    return captured["args"], server.config
