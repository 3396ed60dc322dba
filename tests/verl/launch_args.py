"""Helpers for tests/verl: a recipe's rollout config, and the vLLM arguments verl's real
vLLMHttpServer.launch_server builds from it (imported after the verl gate: they import verl)."""

from omegaconf import OmegaConf

from sam_rollout.verl.launcher import recipe_config
from testkit.verl_launch import launch_server_args

INPUTS = ["actor_rollout_ref.model.path=/unused", "data.train_files=/unused", "data.val_files=/unused"]


def rollout_config(recipe, name, *overrides):
    cfg = recipe_config.compose_recipe(recipe, name, [*INPUTS, *overrides])
    OmegaConf.resolve(cfg)
    return cfg.actor_rollout_ref.rollout


def server_args(rollout_cfg, replica_rank=0, **rollout_fields):
    """vLLM's parsed arguments from verl's real launch_server (testkit.verl_launch), as for a Qwen3-32B path."""
    args, _ = launch_server_args(
        rollout_cfg, replica_rank=replica_rank, model_path="/models/Qwen3-32B", **rollout_fields
    )
    return args
