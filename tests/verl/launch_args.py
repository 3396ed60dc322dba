"""Helpers for tests/verl: a recipe's rollout config, and the vLLM arguments verl's real
vLLMHttpServer.launch_server builds from it (imported after the verl gate: they import verl)."""

import asyncio
import types

from omegaconf import OmegaConf, open_dict
from verl.utils.config import omega_conf_to_dataclass

from rollout.verl import recipe_config, replica

INPUTS = ["actor_rollout_ref.model.path=/unused", "data.train_files=/unused", "data.val_files=/unused"]


def rollout_config(recipe, name, *overrides):
    cfg = recipe_config.compose_recipe(recipe, name, [*INPUTS, *overrides])
    OmegaConf.resolve(cfg)
    return cfg.actor_rollout_ref.rollout


def server_args(rollout_cfg, replica_rank=0, **rollout_fields):
    """Run verl's real launch_server up to the point where it would start vLLM; return vLLM's parsed args.
    rollout_fields: RolloutConfig fields that the YAML schema does not expose (e.g. enable_sleep_mode)."""
    server = object.__new__(replica.SamvLLMHttpServer)  # no Ray actor, no devices: set what launch_server reads
    with open_dict(rollout_cfg):
        rollout_cfg.update(rollout_fields)
    server.config = omega_conf_to_dataclass(rollout_cfg)
    server.model_config = types.SimpleNamespace(
        local_path="/models/Qwen3-32B", trust_remote_code=False, lora={}, lora_rank=0, hf_config=types.SimpleNamespace()
    )
    server.replica_rank, server.node_rank, server.nnodes, server.gpus_per_node = replica_rank, 0, 1, 16
    server.workers = [None] * server.config.tensor_model_parallel_size
    server._disaggregation_role = "null"
    server.profiler_controller = types.SimpleNamespace(check_enable=lambda: False)
    captured = {}

    async def run_server(args):
        captured["args"] = args

    server.run_server = run_server
    asyncio.run(server.launch_server())
    return captured["args"]
