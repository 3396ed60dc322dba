"""A recipe's config, composed and checked before anything launches (the work behind --dry-run).

The config is composed with Hydra against verl's own schema (``pkg://verl.trainer.config``), then
checked the way verl's trainers check it before training (``OmegaConf.resolve``,
``verl.utils.config.validate_config``, verl's dataclasses), plus what fails only later on a cluster or
is silently ignored: the model directory, the data files, SAM's settings, max_model_len against the
model, settings verl's V1 trainer ignores, and what a CPU run needs. Every failure is a RecipeError
with a one-line reason.

SAM's engine settings are ``sam.spec`` (configs/sam/spec/default.yaml), each under one name: a key
that is not there fails with the keys that are.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sam_rollout.engine_kwargs import CUSTOM_CLASS, SAM_METHOD, SAM_PROPOSER, requested_route
from sam_rollout.settings import SWITCH
from sam_rollout.verl.runtime.engine_args import check_route, check_sam_engine_kwargs

REPO = Path(__file__).resolve().parents[3]
RECIPES = REPO / "recipes"
CORE, DAPO_RECIPE = "core", "dapo-recipe"
# the trainer's entry module; verl-recipe's main_dapo only to reproduce the published generation pattern
TRAINERS = {CORE: "verl.trainer.main_ppo", DAPO_RECIPE: "recipe.dapo.main_dapo"}
VERL_PLUGIN = "sam_rollout.verl.plugin"
SPEC = "sam.spec"  # SAM's engine settings: the sam group passes this node whole as sam_spec
# the sam group's keys (configs/sam/enabled.yaml, disabled.yaml); the engine settings are under spec
SAM_KEYS = ("enable", "tag", "num_speculative_tokens", "routing", "spec")


class RecipeError(Exception):
    """A check failed before anything was launched."""


# ---------------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------------


def recipe_dir(recipe: str) -> Path:
    if not RECIPES.is_dir():  # an installed wheel holds no recipes: they live in the repository checkout
        raise RecipeError(
            f"no recipes folder at {RECIPES}: run the launcher from the repository checkout "
            "(bash scripts/run_recipe.sh puts it first on PYTHONPATH)"
        )
    d = RECIPES / recipe
    if not d.is_dir():
        known = sorted(p.name for p in RECIPES.iterdir() if p.is_dir())
        raise RecipeError(f"unknown recipe {recipe!r}; known: {known}")
    return d


def compose_recipe(recipe: str, config_name: str, overrides: Sequence[str]):
    """The composed (unresolved) config, as the trainer's Hydra main composes it from the overrides."""
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
            try:
                return compose(config_name=config_name, overrides=list(overrides))
            except (HydraException, OmegaConfBaseException) as e:
                hint = known_keys(first_line(e), lambda: compose(config_name=config_name))
                raise RecipeError(f"invalid override or config: {first_line(e)}{hint}") from e
    except (HydraException, OmegaConfBaseException) as e:
        raise RecipeError(f"invalid config: {first_line(e)}") from e
    finally:
        os.chdir(cwd)


UNKNOWN_KEY = re.compile(r"Could not override '([^']+)'")


def known_keys(error: str, compose_base) -> str:
    """For an override of a key the config does not have (Hydra says only that it could not override
    it): the keys its parent has, from the config composed without overrides; "" for any other error."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    unknown = UNKNOWN_KEY.match(error)
    if unknown is None:
        return ""
    parent, _, name = unknown.group(1).rpartition(".")
    try:
        base = compose_base()
        node = OmegaConf.select(base, parent) if parent else base
    except (HydraException, OmegaConfBaseException):
        return ""
    if not OmegaConf.is_dict(node) or name in node:
        return ""
    listed = f" {parent or 'The config'} has no key {name!r}; it has: {', '.join(sorted(map(str, node)))}"
    if parent == SPEC:  # the engine settings not listed in configs/sam/spec/default.yaml are added
        listed += f"; any other engine setting is added with a plus, +{SPEC}.{name}=... (docs/settings.md)"
    return listed


def load_recipe(recipe: str, config_name: str, overrides: Sequence[str], trainer: str = CORE):
    """Composed, type-checked, resolved and validated config for a trainer. Raises RecipeError."""
    if trainer not in TRAINERS:
        raise RecipeError(f"unknown trainer {trainer!r}; known: {sorted(TRAINERS)}")
    cfg = compose_recipe(recipe, config_name, overrides)
    check_override_types(compose_recipe(recipe, config_name, []), cfg, overrides)
    resolve_and_validate(cfg, trainer)
    return cfg


def check_override_types(base, cfg, overrides: Sequence[str]) -> None:
    """A scalar override keeps the kind of the value it replaces (Hydra accepts clip_ratio_low=oops,
    and verl's dataclasses do not check it either; it would fail mid-training)."""
    for override in overrides:
        key, sep, _ = override.partition("=")
        if not sep or key.startswith(("+", "~", "hydra.")) or "@" in key or key == f"{SPEC}.{SWITCH}":
            continue  # (the switch takes an integer, null, "auto" or a list: the engine settings check it)
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


def resolve_and_validate(cfg, trainer: str = CORE) -> None:
    """verl's own checks, in the order its trainers run them, then ours. Raises RecipeError."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    try:
        migrate_legacy_reward_impl(cfg)  # the trainers do this first (legacy reward_model.* -> reward.*)
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise RecipeError(f"config does not resolve: {first_line(e)}") from e
    check_required(cfg)
    check_verl_schema(cfg)
    if trainer == CORE:
        check_v1_settings(cfg)
    check_sam(cfg)
    check_router(cfg)
    check_model(cfg)
    check_data(cfg)
    check_parallelism(cfg)
    check_cpu(cfg)


REQUIRED = ("actor_rollout_ref.model.path", "data.train_files", "data.val_files")


def check_required(cfg) -> None:
    """Each required value is given: not missing (``???``), not null, not an empty list. verl's PPO
    trainers build the validation set at start whether or not they validate."""
    from omegaconf import OmegaConf

    missing, empty = [], []
    for key in REQUIRED:
        parent, name = key.rsplit(".", 1)
        node = OmegaConf.select(cfg, parent)
        if OmegaConf.is_missing(node, name):
            missing.append(key)
        elif node.get(name) in (None, "") or (OmegaConf.is_list(node.get(name)) and not node.get(name)):
            empty.append(key)
    if missing:
        raise RecipeError(
            f"missing values: {missing} (the run scripts set them from MODEL_PATH, TRAIN_FILE, TEST_FILE)"
        )
    if empty:
        raise RecipeError(
            f"{empty[0]} is {OmegaConf.select(cfg, empty[0])!r}: verl's PPO trainers load "
            f"{'the model' if empty[0] == REQUIRED[0] else 'it'} at start (validation too, even with "
            "trainer.test_freq=-1); give a path (the run scripts set MODEL_PATH, TRAIN_FILE, TEST_FILE; "
            "python -m sam_rollout.verl.data.prepare writes the data files)"
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
    unknown = [key for key in cfg.sam if key not in SAM_KEYS]
    if unknown:  # a YAML file adds keys freely, and nothing would read them
        raise RecipeError(
            f"unknown key sam.{unknown[0]}; sam has: {', '.join(SAM_KEYS)} (SAM's engine settings are {SPEC}: "
            "docs/settings.md)"
        )
    engine_kwargs = dict(cfg.actor_rollout_ref.rollout.engine_kwargs.get("vllm") or {})
    try:
        settings = check_sam_engine_kwargs(_plain(engine_kwargs))
    except (ValueError, TypeError) as e:
        raise RecipeError(f"invalid SAM setting: {first_line(e)}") from e
    if bool(cfg.sam.enable) != (settings is not None):
        raise RecipeError("sam.enable disagrees with the engine kwargs; choose the arm with sam=enabled|disabled")


def check_vllm_route(cfg, vllm_version: str, routes: frozenset[str]) -> None:
    """The SAM route the engine kwargs ask for (``custom_class`` or method ``sam``) exists in the vLLM
    that will run them (``vllm_version`` offering ``routes``: ``sam_rollout.vllm.routes.available_routes()``);
    the launcher checks the vLLM installed where it trains (``--launcher local``, also inside a Ray job)."""
    engine_kwargs = _plain(dict(cfg.actor_rollout_ref.rollout.engine_kwargs.get("vllm") or {}))
    try:
        check_route(engine_kwargs, vllm_version, routes)
    except ValueError as e:
        switch = ROUTE_OVERRIDES.get(requested_route(engine_kwargs.get("speculative_config")))
        hint = f" In a recipe: {switch}." if switch else ""
        raise RecipeError(f"{SPECULATIVE}: {e}{hint}") from e


SPECULATIVE = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"
# the overrides that move a recipe (configs/sam/enabled.yaml: custom_class) from the route asked for to the other
ROUTE_OVERRIDES = {
    CUSTOM_CLASS: f"{SPECULATIVE}.method={SAM_METHOD} ~{SPECULATIVE}.model "
    f"+{SPECULATIVE}.num_speculative_tokens_per_batch_size=<sam_rollout.vllm.speculator.batch_size_table(settings, "
    "max_num_seqs)>",
    SAM_METHOD: f"{SPECULATIVE}.method={CUSTOM_CLASS} +{SPECULATIVE}.model={SAM_PROPOSER} "
    f"(and ~{SPECULATIVE}.num_speculative_tokens_per_batch_size if it is set)",
}


def router_config_file(cfg) -> Path | None:
    """The rollout router's YAML (``actor_rollout_ref.rollout.router_config_path``), a relative path
    taken from the repository root; None when verl's default router is used."""
    value = cfg.actor_rollout_ref.rollout.get("router_config_path")
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else REPO / path


def check_router(cfg) -> None:
    """What verl would only find when it builds the router, minutes into the run: the YAML, its
    router_class, and (for ours) its settings."""
    path = router_config_file(cfg)
    if path is None:
        return
    key = "actor_rollout_ref.rollout.router_config_path"
    if not path.is_file():
        raise RecipeError(f"{key}: {path} not found (sam.routing chooses configs/router/<name>.yaml)")
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise RecipeError(f"{key}: {path} is not valid YAML: {first_line(e)}") from e
    if not isinstance(raw, dict) or not raw.get("router_class"):
        raise RecipeError(f"{key}: {path} has no router_class (the load balancer's qualified class name)")
    if not isinstance(raw["router_class"], str):
        raise RecipeError(f"{key}: router_class must be a qualified class name (a string), got {raw['router_class']!r}")
    if "defaults" in raw:
        raise RecipeError(f"{key}: {path} has a Hydra defaults block, which verl's router loader rejects")
    from verl.utils.import_utils import load_class_from_fqn

    try:
        cls = load_class_from_fqn(raw["router_class"], "load balancer class")
    except (ImportError, AttributeError, ValueError) as e:
        raise RecipeError(f"{key}: router_class {raw['router_class']!r} in {path} cannot be loaded: {e}") from e
    from sam_rollout.verl.runtime.router import RouterSettings, SamLoadBalancer

    if isinstance(cls, type) and issubclass(cls, SamLoadBalancer):
        try:
            RouterSettings.from_yaml_dict(raw)
        except ValueError as e:
            raise RecipeError(f"{key}: {path}: {e}") from e


# what the engines read from a model's config.json at start (transformers' AutoConfig: model_type;
# vLLM's model registry: architectures), checked here so that a malformed file fails before launch
MODEL_CONFIG_KEYS = {"model_type": str, "architectures": list}


def read_model_config(path: Path) -> dict:
    """The model directory's config.json as a dict. Raises RecipeError naming the file and the fix."""
    config_json = path / "config.json"
    if not config_json.is_file():
        raise RecipeError(f"model path {path} has no config.json (set MODEL_PATH to a Hugging Face model directory)")
    fix = "(a Hugging Face model directory's config.json; download the model again or fix the file)"
    try:
        hf = json.loads(config_json.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecipeError(f"{config_json} is not valid JSON: {first_line(e)} {fix}") from e
    if not isinstance(hf, dict):
        raise RecipeError(f"{config_json} holds a JSON {type(hf).__name__}, not an object {fix}")
    for key, kind in MODEL_CONFIG_KEYS.items():
        if not isinstance(hf.get(key), kind) or not hf[key]:
            got = "no such key" if key not in hf else f"got {hf[key]!r}"
            raise RecipeError(f"{config_json}: {key} must be a non-empty {kind.__name__} ({got}) {fix}")
    limit = hf.get("max_position_embeddings")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise RecipeError(f"{config_json}: max_position_embeddings must be a positive integer, got {limit!r} {fix}")
    return hf


def check_model(cfg) -> None:
    path = Path(str(cfg.actor_rollout_ref.model.path)).expanduser()
    limit = read_model_config(path).get("max_position_embeddings")
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
                raise RecipeError(
                    f"data.{key}: {f} not found (prepare it with python -m sam_rollout.verl.data.prepare)"
                )


def check_parallelism(cfg) -> None:
    rollout, trainer = cfg.actor_rollout_ref.rollout, cfg.trainer
    devices = trainer.n_gpus_per_node * trainer.nnodes
    tp = rollout.tensor_model_parallel_size
    if devices % tp:
        raise RecipeError(f"rollout tensor parallel size {tp} does not divide {devices} devices")
    gen, train = cfg.data.get("gen_batch_size"), cfg.data.train_batch_size
    if gen is not None and gen < train:
        raise RecipeError(f"data.gen_batch_size {gen} is smaller than data.train_batch_size {train}")


def check_v1_settings(cfg) -> None:
    """Settings verl's V1 trainer (the core default) would silently ignore with group filtering on."""
    if not cfg.trainer.get("use_v1", True) or not cfg.algorithm.filter_groups.get("enable", False):
        return
    fg = cfg.algorithm.filter_groups
    if fg.get("max_num_gen_batches", 0) > 0:
        raise RecipeError(
            f"algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches} is ignored by verl's V1 trainer, "
            "which refills filtered groups without a cap; it bounds the prompts in flight with "
            "algorithm.filter_groups.max_inflight_gen_batches (in train_batch_size units) instead"
        )
    gen = cfg.data.get("gen_batch_size")
    if gen not in (None, 1):
        raise RecipeError(
            f"data.gen_batch_size={gen} is overridden to 1 by verl's V1 trainer with group filtering (it sends one "
            "prompt at a time); set algorithm.filter_groups.max_inflight_gen_batches="
            f"{max(1, gen // cfg.data.train_batch_size)} for about as many prompts in flight"
        )


def check_cpu(cfg) -> None:
    """A CPU run needs this package's verl plugin (the "cpu" platform) and settings a CPU can run."""
    if cfg.trainer.get("device") != "cpu":
        return
    from verl.plugin.platform.platform_manager import PlatformRegistry

    # verl (imported by the checks before) loads its plugins on import and drops those that fail silently
    if PlatformRegistry.get("cpu") is None:
        raise RecipeError(
            f"trainer.device=cpu needs this package's verl plugin (verl.plugins entry point {VERL_PLUGIN}), and verl "
            "did not load it: install the repository into verl's environment (pip install -e .; "
            "scripts/setup_verl_env.sh does it), leave VERL_USE_EXTERNAL_PLUGINS unset, and check that "
            f"python -c 'import {VERL_PLUGIN}' works"
        )
    from sam_rollout.verl.cpu.patches import CpuConfigError, check_cpu_config
    from sam_rollout.verl.cpu.platform import PLATFORM_ENV, PLATFORM_NAME

    env = cfg.ray_kwargs.ray_init.runtime_env.get("env_vars") or {}
    if str(env.get(PLATFORM_ENV, "")).lower() != PLATFORM_NAME:
        raise RecipeError(
            f"trainer.device=cpu: set ray_kwargs.ray_init.runtime_env.env_vars.{PLATFORM_ENV}={PLATFORM_NAME} "
            "so that every Ray worker uses the CPU platform"
        )
    try:
        check_cpu_config(cfg)
    except CpuConfigError as e:
        raise RecipeError(str(e)) from e


def _plain(value: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
