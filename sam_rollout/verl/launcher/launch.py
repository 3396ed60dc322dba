"""Compose, check and launch a recipe: the work behind scripts/run_*.sh.

    python -m sam_rollout.verl.launcher.launch --recipe dapo_qwen3_32b [--config-name NAME] [--trainer core|dapo-recipe]
        [--launcher local|ray-job] [--dry-run] [hydra overrides ...]

The config is composed and checked first (``sam_rollout.verl.launcher.recipe_config``). ``--dry-run`` prints the
training command and the resolved config and stops. ``local`` runs verl's trainer here (this machine
is a single node, or the Ray head, or inside a Ray job). ``ray-job`` submits this same launcher as a
Ray job (``ray job submit --no-wait``, with configs/ray/runtime_env.yaml and this repository as the
working dir), so the trainer's command is built on the cluster from paths that exist there.
Exit status 2 with a one-line reason on any failed check.

A local run keeps the console readable (``sam_rollout.verl.launcher.console``): everything verl, Ray and vLLM print
goes to a log file beside the run's metrics, named on the first line; the console shows one line per
training step and the end. ``--verbose`` (or ``SAM_CONSOLE=full``) prints everything instead.

The trainer is verl core's (``verl.trainer.main_ppo``, its V1 trainer does DAPO). ``--trainer
dapo-recipe`` runs verl-recipe's ``recipe.dapo.main_dapo`` instead, only to reproduce the published
generation pattern (``data.gen_batch_size`` prompts at once, up to ``max_num_gen_batches``), which V1
replaces with continuous refill; it needs a verl-recipe checkout (``VERL_RECIPE_PATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence

from sam_rollout.patches import check_removed_env
from sam_rollout.verl.launcher.console import full_console, log_file, run_logged
from sam_rollout.verl.launcher.recipe_config import (
    CORE,
    REPO,
    TRAINERS,
    RecipeError,
    check_vllm_route,
    load_recipe,
    recipe_dir,
    router_config_file,
)

RUNTIME_ENV = REPO / "configs" / "ray" / "runtime_env.yaml"
# Ray refuses to merge a job's runtime env with the one verl's trainer passes to ray.init when both set
# a key, even to equal values; with this set, the trainer's (the recipe's) wins.
RAY_JOB_ENV = {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}
# the submitter's say on where the metrics go, whether weight syncs log checksums, what the console
# shows and how wandb runs (WANDB_MODE=offline: no account, no network)
PASSED_TO_JOB = ("VERL_FILE_LOGGER_ROOT", "VERL_FILE_LOGGER_PATH", "SAM_PATCH_WEIGHT_CHECKSUMS", "SAM_CONSOLE",
                 "WANDB_MODE", "WANDB_DIR", "WANDB_SILENT")  # fmt: skip
# ray.init refuses resource arguments when it joins a running cluster (a Ray job, RAY_ADDRESS)
CLUSTER_OWNED_RAY_INIT = ("num_cpus", "num_gpus", "object_store_memory", "include_dashboard")


def training_command(recipe: str, config_name: str, overrides: Sequence[str], trainer: str = CORE) -> list[str]:
    """verl's trainer on this machine's copy of the recipe (absolute: Hydra resolves it from the trainer's file)."""
    return [
        sys.executable,
        "-m",
        TRAINERS[trainer],
        f"--config-path={recipe_dir(recipe)}",
        f"--config-name={config_name}",
        *overrides,
    ]


def joining_cluster_overrides(cfg) -> list[str]:
    """When RAY_ADDRESS names a running cluster, the resources are the cluster's, not ray.init's."""
    ray_init = cfg.ray_kwargs.ray_init
    return [f"ray_kwargs.ray_init.{key}=null" for key in CLUSTER_OWNED_RAY_INIT if ray_init.get(key) is not None]


def absolute_path_overrides(cfg) -> list[str]:
    """verl resolves the router's YAML from the working directory of the trainer's Ray worker, which
    need not be this repository: pass the path as an absolute one."""
    path = router_config_file(cfg)
    return [] if path is None else [f"actor_rollout_ref.rollout.router_config_path={path}"]


def runtime_env(cfg) -> dict:
    """configs/ray/runtime_env.yaml for the job, plus verl-recipe as a py_module when VERL_RECIPE_PATH is set."""
    import yaml

    env = yaml.safe_load(RUNTIME_ENV.read_text())
    hook = cfg.ray_kwargs.ray_init.runtime_env.get("worker_process_setup_hook")
    if hook and env.get("worker_process_setup_hook") != hook:
        raise RecipeError(f"{RUNTIME_ENV} and the recipe name different worker_process_setup_hook values")
    env_vars = env.setdefault("env_vars", {})
    env_vars.update(RAY_JOB_ENV)
    for key in PASSED_TO_JOB:
        if os.environ.get(key):
            env_vars[key] = os.environ[key]
    recipe_path = os.environ.get("VERL_RECIPE_PATH")
    if recipe_path:
        env.setdefault("py_modules", []).append(os.path.join(recipe_path, "recipe"))
    return env


def launcher_in_job(args: argparse.Namespace) -> list[str]:
    """This launcher, as the Ray job's entrypoint (run in the job's copy of the working dir)."""
    cmd = ["python3", "-m", "sam_rollout.verl.launcher.launch", "--recipe", args.recipe, "--trainer", args.trainer]
    if args.config_name:
        cmd += ["--config-name", args.config_name]
    if args.verbose:
        cmd.append("--verbose")
    return [*cmd, "--launcher", "local", *args.overrides]


def ray_address() -> str:
    return os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")


def ray_job_command(entrypoint: Sequence[str], env: dict, submission_id: str) -> list[str]:
    """``ray job submit`` with this Python's Ray (the one verl runs with)."""
    return [
        sys.executable, "-m", "ray.scripts.scripts", "job", "submit", f"--address={ray_address()}",
        f"--submission-id={submission_id}", f"--runtime-env-json={json.dumps(env)}", f"--working-dir={REPO}",
        "--no-wait", "--", *entrypoint,
    ]  # fmt: skip


def local_env(env: dict) -> dict:
    """This process's environment plus the job env's variables, with this repository (and verl-recipe) on
    PYTHONPATH."""
    out = dict(os.environ)
    out.update({k: str(v) for k, v in (env.get("env_vars") or {}).items()})
    paths = [str(REPO)]
    if os.environ.get("VERL_RECIPE_PATH"):
        paths.append(os.environ["VERL_RECIPE_PATH"])
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    return out


def check_entry_importable(trainer: str, env: dict) -> None:
    module = TRAINERS[trainer]
    probe = [
        sys.executable,
        "-c",
        f"import importlib.util, sys; sys.exit(importlib.util.find_spec('{module}') is None)",
    ]
    if subprocess.run(probe, env=env, capture_output=True).returncode != 0:
        hint = (
            "clone verl-recipe as <dir>/recipe and set VERL_RECIPE_PATH=<dir>"
            if trainer != CORE
            else "install verl 0.9.1 (scripts/setup_verl_env.sh)"
        )
        raise RecipeError(f"{module} is not importable: {hint}")


# the vLLM the trainer will run and its SAM routes, asked in the trainer's environment (sam_rollout.verl does
# not import sam_rollout.vllm); prints nothing where vLLM is not installed
VLLM_ROUTES_PROBE = (
    "import importlib.util, json\n"
    "if importlib.util.find_spec('vllm') is not None:\n"
    "    import vllm\n"
    "    from sam_rollout.vllm.routes import available_routes\n"
    "    print(json.dumps([getattr(vllm, '__version__', 'unknown'), sorted(available_routes())]))\n"
)


def installed_vllm_routes(env: dict) -> tuple[str, frozenset[str]] | None:
    """(version, SAM routes) of the vLLM in the trainer's environment; None without vLLM."""
    probe = subprocess.run([sys.executable, "-c", VLLM_ROUTES_PROBE], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        raise RecipeError(f"vLLM does not import in the trainer's environment ({sys.executable}): {reason}")
    lines = probe.stdout.strip().splitlines()
    if not lines:
        return None
    version, routes = json.loads(lines[-1])
    return version, frozenset(routes)


def check_installed_vllm(cfg, env: dict) -> None:
    """``--launcher local`` trains here: the recipe's SAM route must exist in the vLLM installed here
    (a Ray job runs this launcher again on the cluster). Asks vLLM only when SAM is on."""
    if not cfg.sam.enable:
        return
    found = installed_vllm_routes(env)
    if found is not None:
        check_vllm_route(cfg, *found)


def check_env() -> None:
    """A removed patch switch fails here: verl drops its plugin's error unseen, and the patches with it."""
    try:
        check_removed_env(os.environ)
    except ValueError as e:
        raise RecipeError(str(e)) from None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", required=True, help="folder under recipes/")
    p.add_argument("--config-name", help="config in the recipe folder (default: the recipe's name)")
    p.add_argument("--trainer", choices=sorted(TRAINERS), default=CORE, help="core: verl.trainer.main_ppo")
    p.add_argument("--launcher", choices=("local", "ray-job"), default="local")
    p.add_argument("--dry-run", action="store_true", help="print the command and resolved config; launch nothing")
    p.add_argument("--verbose", action="store_true", help="everything on the console, no log file (SAM_CONSOLE=full)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sam.spec.switch=4")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config_name = args.config_name or args.recipe
    logged = args.launcher == "local" and not args.dry_run and not full_console(args.verbose)
    checks_output = io.StringIO()  # what composing and checking prints goes to the log, ahead of the trainer's
    try:
        check_env()
        overrides = list(args.overrides)
        with captured(checks_output, logged):
            cfg = load_recipe(args.recipe, config_name, overrides, args.trainer)
        env = runtime_env(cfg)
        if args.launcher == "ray-job":
            submission_id = f"sam-{args.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
            cmd = ray_job_command(launcher_in_job(args), env, submission_id)
        else:
            check_installed_vllm(cfg, local_env(env))
            overrides = [*overrides, *absolute_path_overrides(cfg)]
            if os.environ.get("RAY_ADDRESS"):
                overrides += joining_cluster_overrides(cfg)
            cmd = training_command(args.recipe, config_name, overrides, args.trainer)
        if args.dry_run:
            print_dry_run(cmd, cfg, env)
            return 0
        launch_env = local_env(env)
        if args.launcher == "local":
            check_entry_importable(args.trainer, launch_env)
    except RecipeError as e:
        sys.stderr.write(checks_output.getvalue())
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.chdir(REPO)  # the recipes' search path file://configs is relative to the repository
    if logged:
        log = log_file(launch_env, cfg.trainer.project_name, cfg.trainer.experiment_name)
        header = console_header(args.recipe, config_name, cfg)
        return run_logged(cmd, launch_env, log, header, cfg.trainer.total_training_steps, checks_output.getvalue())
    print("+ " + shlex.join(cmd), flush=True)
    if args.launcher == "ray-job":
        print(f"follow it: ray job logs --address {ray_address()} --follow {submission_id}", flush=True)
    os.execvpe(cmd[0], cmd, launch_env)


@contextlib.contextmanager
def captured(buffer: io.StringIO, enabled: bool):
    """stdout and stderr (verl's check messages and warnings) into ``buffer`` while ``enabled``."""
    if not enabled:
        yield
        return
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        yield


def console_header(recipe: str, config_name: str, cfg) -> list[str]:
    """What runs: recipe, arm, rollout replicas, steps; and how to see everything."""
    rollout = cfg.actor_rollout_ref.rollout
    ranks_per_replica = (
        rollout.tensor_model_parallel_size
        * rollout.get("data_parallel_size", 1)
        * rollout.get("pipeline_model_parallel_size", 1)
    )
    replicas = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes // ranks_per_replica
    sam = cfg.get("sam") or {}
    arm = "SAM on" if sam.get("enable") else "SAM off (baseline)"
    steps = cfg.trainer.total_training_steps
    steps = "all training steps" if not steps else f"{steps} training step{'s' if steps != 1 else ''}"
    return [
        f"[sam] recipe {recipe} ({config_name}): {arm}, {replicas} rollout replica{'s' if replicas != 1 else ''}, "
        f"{steps}, loggers {', '.join(cfg.trainer.logger)}",
        "[sam] verl, Ray and vLLM write to the full log; --verbose or SAM_CONSOLE=full shows them here",
    ]


def print_dry_run(cmd: Sequence[str], cfg, env: dict) -> None:
    from omegaconf import OmegaConf

    print("# dry run: nothing launched")
    print("# command:")
    print(shlex.join(cmd))
    print("# runtime env (Ray job):")
    print(json.dumps(env, indent=2, sort_keys=True))
    print("# resolved config:")
    print(OmegaConf.to_yaml(cfg))
    print("# checks passed: verl's validate_config and dataclasses; V1, SAM, model, data, parallelism, CPU")


if __name__ == "__main__":
    sys.exit(main())
