"""Compose, check and launch a recipe: the work behind scripts/run_*.sh.

    python -m rollout.verl.launch --recipe dapo_qwen3_32b [--config-name NAME]
        [--launcher local|ray-job] [--dry-run] [hydra overrides ...]

The recipe's config is composed with Hydra against verl's own schema (``pkg://verl.trainer.config``),
then checked the way verl-recipe's DAPO TaskRunner checks it before training (``OmegaConf.resolve``,
``verl.utils.config.validate_config``, verl's dataclasses), plus what fails only later on a
cluster: the model directory, the data files, SAM's settings, max_model_len against the model.
``--dry-run`` prints the training command and the resolved config and stops; otherwise the
command is run here (``local``: this machine is a Ray head or single node) or submitted
(``ray-job``: ``ray job submit --no-wait`` with configs/ray/runtime_env.yaml).
Exit status 2 with a one-line reason on any failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.verl.engine_args import check_sam_engine_kwargs

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
RUNTIME_ENV = REPO / "configs" / "ray" / "runtime_env.yaml"
ENTRY_MODULE = "recipe.dapo.main_dapo"  # verl-recipe's DAPO entry point


class RecipeError(Exception):
    """A check failed before anything was launched."""


# ---------------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------------


def recipe_dir(recipe: str) -> Path:
    d = RECIPES / recipe
    if not d.is_dir():
        known = sorted(p.name for p in RECIPES.iterdir() if p.is_dir())
        raise RecipeError(f"unknown recipe {recipe!r}; known: {known}")
    return d


def compose_recipe(recipe: str, config_name: str, overrides: Sequence[str]):
    """The composed (unresolved) config, as `python -m recipe.dapo.main_dapo` would compose it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    d = recipe_dir(recipe)
    if not (d / f"{config_name}.yaml").is_file():
        raise RecipeError(f"no config {config_name!r} in {d}")
    cwd = os.getcwd()
    os.chdir(REPO)  # the recipes' search path file://configs is relative to the repository
    try:
        with initialize_config_dir(config_dir=str(d), version_base=None):
            return compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise RecipeError(f"invalid override or config: {first_line(e)}") from e
    finally:
        os.chdir(cwd)


def load_recipe(recipe: str, config_name: str, overrides: Sequence[str]):
    """Composed, type-checked, resolved and validated config. Raises RecipeError."""
    cfg = compose_recipe(recipe, config_name, overrides)
    check_override_types(compose_recipe(recipe, config_name, []), cfg, overrides)
    resolve_and_validate(cfg)
    return cfg


def check_override_types(base, cfg, overrides: Sequence[str]) -> None:
    """A scalar override keeps the kind of the value it replaces (Hydra accepts clip_ratio_low=oops,
    and verl's dataclasses do not check it either; it would fail mid-training)."""
    for override in overrides:
        key, sep, _ = override.partition("=")
        if not sep or key.startswith(("+", "~", "hydra.")) or "@" in key:
            continue
        before, after = _select(base, key), _select(cfg, key)
        if before is None or after is None or not isinstance(before, (bool, int, float, str)):
            continue  # a group, a container, or a nullable value
        if _kind(before) != _kind(after):
            raise RecipeError(f"invalid override {override!r}: {key} takes a {_kind(before)}, got {after!r}")


def _select(cfg, key: str):
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    except OmegaConfBaseException:
        return None  # depends on a value given elsewhere (e.g. the model path)


def _kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def resolve_and_validate(cfg) -> None:
    """verl's own checks, in the order main_dapo runs them, then ours. Raises RecipeError."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    try:
        migrate_legacy_reward_impl(cfg)  # main_dapo does this first (legacy reward_model.* -> reward.*)
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise RecipeError(f"config does not resolve: {first_line(e)}") from e
    check_required(cfg)
    check_verl_schema(cfg)
    check_sam(cfg)
    check_model(cfg)
    check_data(cfg)
    check_parallelism(cfg)


REQUIRED = ("actor_rollout_ref.model.path", "data.train_files", "data.val_files")


def check_required(cfg) -> None:
    from omegaconf import OmegaConf

    missing = [
        key
        for key in REQUIRED
        if OmegaConf.is_missing(OmegaConf.select(cfg, key.rsplit(".", 1)[0]), key.rsplit(".", 1)[1])
    ]
    if missing:
        raise RecipeError(
            f"missing values: {missing} (the run scripts set them from MODEL_PATH, TRAIN_FILE, TEST_FILE)"
        )


def check_verl_schema(cfg) -> None:
    from hydra.errors import InstantiationException
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    try:
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        omega_conf_to_dataclass(cfg.algorithm)
    except (AssertionError, ValueError, TypeError, KeyError, InstantiationException) as e:
        raise RecipeError(f"verl rejects the config: {first_line(e)}") from e


def check_sam(cfg) -> None:
    engine_kwargs = dict(cfg.actor_rollout_ref.rollout.engine_kwargs.get("vllm") or {})
    try:
        settings = check_sam_engine_kwargs(_plain(engine_kwargs))
    except (ValueError, TypeError) as e:
        raise RecipeError(f"invalid SAM setting: {first_line(e)}") from e
    if bool(cfg.sam.enable) != (settings is not None):
        raise RecipeError("sam.enable disagrees with the engine kwargs; choose the arm with sam=enabled|disabled")


def check_model(cfg) -> None:
    path = Path(str(cfg.actor_rollout_ref.model.path)).expanduser()
    config_json = path / "config.json"
    if not config_json.is_file():
        raise RecipeError(f"model path {path} has no config.json (set MODEL_PATH to a Hugging Face model directory)")
    hf = json.loads(config_json.read_text())
    limit = hf.get("max_position_embeddings")
    max_model_len = cfg.actor_rollout_ref.rollout.max_model_len
    if limit is not None and max_model_len is not None and max_model_len > limit:
        raise RecipeError(f"rollout.max_model_len {max_model_len} exceeds the model's max_position_embeddings {limit}")


def check_data(cfg) -> None:
    for key in ("train_files", "val_files"):
        value = cfg.data[key]
        files = [value] if isinstance(value, str) else list(value)
        for f in files:
            if "://" in str(f):
                continue  # remote (hdfs://, s3://): verl copies it at start
            if not Path(str(f)).expanduser().is_file():
                raise RecipeError(f"data.{key}: {f} not found (prepare it with scripts/prepare_dapo_data.py)")


def check_parallelism(cfg) -> None:
    rollout, trainer = cfg.actor_rollout_ref.rollout, cfg.trainer
    devices = trainer.n_gpus_per_node * trainer.nnodes
    tp = rollout.tensor_model_parallel_size
    if devices % tp:
        raise RecipeError(f"rollout tensor parallel size {tp} does not divide {devices} devices")
    gen, train = cfg.data.gen_batch_size, cfg.data.train_batch_size
    if gen is not None and gen < train:
        raise RecipeError(f"data.gen_batch_size {gen} is smaller than data.train_batch_size {train}")


def _plain(value: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def training_command(recipe: str, config_name: str, overrides: Sequence[str], python: str = "python3") -> list[str]:
    return [
        python,
        "-m",
        ENTRY_MODULE,
        f"--config-path={recipe_dir(recipe)}",
        f"--config-name={config_name}",
        *overrides,
    ]


def runtime_env(cfg) -> dict:
    """configs/ray/runtime_env.yaml, plus verl-recipe as a py_module when VERL_RECIPE_PATH is set."""
    import yaml

    env = yaml.safe_load(RUNTIME_ENV.read_text())
    hook = cfg.ray_kwargs.ray_init.runtime_env.get("worker_process_setup_hook")
    if hook and env.get("worker_process_setup_hook") != hook:  # Ray refuses two different hooks
        raise RecipeError(f"{RUNTIME_ENV} and the recipe name different worker_process_setup_hook values")
    recipe_path = os.environ.get("VERL_RECIPE_PATH")
    if recipe_path:
        env.setdefault("py_modules", []).append(str(Path(recipe_path) / "recipe"))
    return env


def ray_job_command(train_cmd: Sequence[str], env: dict) -> list[str]:
    address = os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")
    return [
        "ray",
        "job",
        "submit",
        f"--address={address}",
        f"--runtime-env-json={json.dumps(env)}",
        f"--working-dir={REPO}",
        "--no-wait",
        "--",
        *train_cmd,
    ]


def local_env(env: dict) -> dict:
    """This process's environment plus the runtime env's variables, verl-recipe and this repository on PYTHONPATH."""
    out = dict(os.environ)
    out.update({k: str(v) for k, v in (env.get("env_vars") or {}).items()})
    paths = [str(REPO)]
    if os.environ.get("VERL_RECIPE_PATH"):
        paths.append(os.environ["VERL_RECIPE_PATH"])
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    return out


def check_entry_importable(env: dict) -> None:
    import subprocess

    probe = [
        sys.executable,
        "-c",
        f"import importlib.util, sys; sys.exit(importlib.util.find_spec('{ENTRY_MODULE}') is None)",
    ]
    if subprocess.run(probe, env=env, capture_output=True).returncode != 0:
        raise RecipeError(
            f"{ENTRY_MODULE} is not importable: clone verl-recipe as <dir>/recipe and set VERL_RECIPE_PATH=<dir>"
        )


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", required=True, help="folder under recipes/")
    p.add_argument("--config-name", help="config in the recipe folder (default: the recipe's name)")
    p.add_argument("--launcher", choices=("local", "ray-job"), default="local")
    p.add_argument("--dry-run", action="store_true", help="print the command and resolved config; launch nothing")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sam.threshold=4")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config_name = args.config_name or args.recipe
    try:
        cfg = load_recipe(args.recipe, config_name, args.overrides)
        env = runtime_env(cfg)
        cmd = training_command(args.recipe, config_name, args.overrides)
        if args.launcher == "ray-job":
            cmd = ray_job_command(cmd, env)
        if args.dry_run:
            print_dry_run(cmd, cfg, env)
            return 0
        launch_env = local_env(env)
        if args.launcher == "local":
            check_entry_importable(launch_env)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("+ " + shlex.join(cmd), flush=True)
    os.chdir(REPO)
    os.execvpe(cmd[0], cmd, launch_env)


def print_dry_run(cmd: Sequence[str], cfg, env: dict) -> None:
    from omegaconf import OmegaConf

    print("# dry run: nothing launched")
    print("# command:")
    print(shlex.join(cmd))
    print("# runtime env (Ray):")
    print(json.dumps(env, indent=2, sort_keys=True))
    print("# resolved config:")
    print(OmegaConf.to_yaml(cfg))
    print("# checks passed: verl validate_config, verl dataclasses, SAM settings, model, data, parallelism")


if __name__ == "__main__":
    sys.exit(main())
