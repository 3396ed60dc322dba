"""SAM's prompt stores in verl's checkpoints: saved with every checkpoint, loaded on resume.

verl 0.9.1's V1 trainer (``verl.trainer.ppo.v1.trainer_base.PPOTrainer``) saves a checkpoint in
``_save_checkpoint`` and resumes in ``_load_checkpoint``, which its setup calls once the rollout
servers run. ``wrap()`` wraps both (idempotent); ``install()``, called by ``sam_rollout.verl.runtime.hook`` in every
Ray worker, has it done when a process (the trainer's) imports that module:

- after a save, every rollout replica with the prompt store on writes its store to
  ``<default_local_dir>/global_step_<N>/sam_prompt_store/<key>.npz`` (docs/prompt-store.md), the key
  being the replica's own (``rollout_<replica_rank><name suffix>``; a second rollout server manager's
  replicas are prefixed ``manager<i>_``, so no two replicas share a file); as verl does for the actor,
  only this run's newest ``trainer.max_actor_ckpt_to_keep`` checkpoints keep theirs;
- after a resume from ``global_step_<N>``, every such replica loads its key's file into every worker.
  Where only some workers of an engine loaded it, every worker of that engine is emptied (its workers
  must hold the same store to draft alike). Our router names replicas by the same keys, so a prompt
  goes to the replica whose file holds it;
- our router's memory of which replicas served each prompt, what its requests cost, and what its load
  bound learned (``router.json``) is saved and loaded beside the stores, so a resumed router routes as
  the uninterrupted one would.

The engines' workers read and write the files, so paths are absolute and the folder must be one they
can reach. Nothing here stops training: a store that cannot be saved is logged as an error, one that
cannot be loaded is reported as a warning, and that replica's store starts empty.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from typing import Any

from sam_rollout.import_hooks import after_import
from sam_rollout.verl.runtime import tracking

logger = logging.getLogger(__name__)

TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"
_MARK = "__sam_spec_wrapped__"
STORE_DIR = "sam_prompt_store"
ROUTER_STATE = "router.json"  # sam_rollout.verl.runtime.router.SamLoadBalancer.save_state, beside the stores
RPC_TIMEOUT_S = 600.0  # a store of a few GiB is written or read in seconds; a busy file system takes longer

_saved_folders: list[str] = []  # this process's saved store folders, oldest first


def install() -> None:
    """``wrap()`` once the trainer module is imported (it imports much of verl: not in every worker)."""
    after_import(TRAINER_MODULE, wrap)


def wrap() -> None:
    """Wrap the V1 trainer's ``_save_checkpoint`` and ``_load_checkpoint`` (idempotent)."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    if getattr(PPOTrainer._save_checkpoint, _MARK, False):
        return
    save, load = PPOTrainer._save_checkpoint, PPOTrainer._load_checkpoint

    def _save_checkpoint(self, *args, **kwargs):
        out = save(self, *args, **kwargs)
        _never_raise(after_save, self)
        return out

    def _load_checkpoint(self, *args, **kwargs):
        out = load(self, *args, **kwargs)
        _never_raise(after_load, self)
        return out

    for method, original in ((_save_checkpoint, save), (_load_checkpoint, load)):
        setattr(method, _MARK, True)
        method.__wrapped__ = original
        setattr(PPOTrainer, original.__name__, method)


def after_save(trainer) -> None:
    replicas = prompt_store_replicas(trainer)
    if not replicas:
        return
    folder = saved_checkpoint_folder(trainer.config.trainer, trainer.global_steps)
    save_prompt_stores(replicas, folder)
    save_router_state(folder)
    _saved_folders.append(os.path.join(folder, STORE_DIR))
    keep = checkpoints_kept(trainer.config.trainer)
    while keep and len(_saved_folders) > keep:  # as verl does for the actor: this run's saves only
        shutil.rmtree(_saved_folders.pop(0), ignore_errors=True)


def after_load(trainer) -> None:
    replicas = prompt_store_replicas(trainer)
    folder = resumed_checkpoint_folder(trainer.config.trainer, trainer.global_steps)
    if replicas and folder is not None:
        load_router_state(folder)
        load_prompt_stores(replicas, folder)


# -- where ----------------------------------------------------------------------------------------
def saved_checkpoint_folder(trainer_config, global_steps: int) -> str:
    """The folder ``_save_checkpoint`` wrote (``<default_local_dir>/global_step_<N>``), absolute."""
    return os.path.abspath(os.path.join(trainer_config.default_local_dir, f"global_step_{global_steps}"))


def resumed_checkpoint_folder(trainer_config, global_steps: int) -> str | None:
    """The folder ``_load_checkpoint`` resumed from, absolute (as verl makes it); None when it started
    from scratch (``global_steps`` still 0, resume_mode disable, or one verl does not know)."""
    mode = trainer_config.resume_mode
    if global_steps <= 0 or mode not in ("auto", "resume_path"):
        return None
    if mode == "resume_path":  # verl took global_steps from this folder's name
        return os.path.abspath(trainer_config.resume_from_path)
    return saved_checkpoint_folder(trainer_config, global_steps)  # auto: the tracker's global_step_<N>


def store_path(checkpoint_folder: str, store_key: str) -> str:
    return os.path.join(checkpoint_folder, STORE_DIR, f"{store_key}.npz")


def checkpoints_kept(trainer_config) -> int | None:
    """How many checkpoints verl keeps (its actor's rule); None: all."""
    if trainer_config.get("remove_previous_ckpt_in_save", False):
        return 1
    return trainer_config.get("max_actor_ckpt_to_keep", None)


# -- which replicas, and the calls ------------------------------------------------------------------
def prompt_store_replicas(trainer) -> dict[str, Any]:
    """{store key: replica} of the trainer's rollout replicas (those of every rollout server manager)
    with the store on. The key is the replica's (``sam_key``); a later manager's are prefixed with its
    index, so two managers' rank-r replicas never share a file."""
    managers = trainer._rollout_server_managers()  # verl's list of the managers that serve rollout
    out = {}
    for i, manager in enumerate(managers):
        for r in manager.get_replicas():
            if getattr(r, "sam_prompt_store", False) and r.servers:
                key = r.sam_key if i == 0 else f"manager{i}_{r.sam_key}"
                if key in out:
                    raise ValueError(f"two rollout replicas have the prompt store key {key!r}")
                out[key] = r
    return out


def save_prompt_stores(replicas: Mapping[str, Any], checkpoint_folder: str) -> None:
    """Each replica's first server (node rank 0 owns the engine) saves its store; one line each."""
    paths = {key: store_path(checkpoint_folder, key) for key in replicas}
    refs = {key: r.servers[0].sam_save_prompt_store.remote(paths[key]) for key, r in replicas.items()}
    for key, per_worker in _results(refs).items():
        saved = next((w for w in per_worker if w), None) if isinstance(per_worker, list) else None
        if saved is not None and "error" not in saved:
            print(
                f"[sam] prompt store of {key}: saved {saved['prompts']} prompts, "
                f"{saved['tokens']} tokens ({saved['file_bytes'] / 2**20:.1f} MiB) to {saved['path']}",
                flush=True,
            )
        else:
            reason = saved["error"] if saved is not None else _failure(per_worker)
            logger.error(
                "SAM prompt store of %s NOT saved to %s: %s. The checkpoint is otherwise "
                "complete; a resume from it starts this replica with an empty prompt store.",
                key,
                paths[key],
                reason,
            )


def load_prompt_stores(replicas: Mapping[str, Any], checkpoint_folder: str) -> None:
    """Each replica's engine loads its key's file into every worker; one line each. An engine whose
    workers did not all load the same store is emptied on every worker."""
    paths = {key: store_path(checkpoint_folder, key) for key in replicas}
    refs = {key: r.servers[0].sam_load_prompt_store.remote(paths[key]) for key, r in replicas.items()}
    for key, per_worker in _results(refs).items():
        problem = load_problem(per_worker)
        if problem is None:
            loaded = [w for w in per_worker if w]
            print(
                f"[sam] prompt store of {key}: loaded {loaded[0]['prompts']} prompts, "
                f"{loaded[0]['tokens']} tokens from {paths[key]} into {len(loaded)} worker(s)",
                flush=True,
            )
            continue
        if isinstance(per_worker, Exception) or any(w and not w["warning"] for w in per_worker):
            problem += "; " + _clear(replicas[key])  # a partial load: every worker starts empty
        # printed: importing vLLM's API server sets the root logger and its handlers to ERROR
        # (model_hosting_container_standards), which would swallow a logged warning here
        print(f"[sam] WARNING: prompt store of {key} starts empty: {problem}", flush=True)


def load_problem(per_worker) -> str | None:
    """Why an engine's workers do not all hold the loaded store (None: they all do, the same one)."""
    if isinstance(per_worker, Exception) or not isinstance(per_worker, list):
        return _failure(per_worker)
    loaded = [w for w in per_worker if w]
    if not loaded:
        return "no worker has a store"
    warnings = [w["warning"] for w in loaded if w["warning"]]
    if len(warnings) == len(loaded):
        return warnings[0]
    if warnings:
        return f"only {len(loaded) - len(warnings)} of {len(loaded)} workers loaded it ({warnings[0]})"
    if len({(w["prompts"], w["responses"], w["tokens"]) for w in loaded}) > 1 or len(loaded) < len(per_worker):
        return f"the workers loaded different stores: {[(w and w['prompts']) for w in per_worker]} prompts"
    return None


def _clear(replica) -> str:
    """Empty the store of every worker of one engine; what happened, in a few words."""
    import ray

    try:
        cleared = ray.get(replica.servers[0].sam_clear_prompt_store.remote(), timeout=RPC_TIMEOUT_S)
    except Exception as e:
        return f"emptying its workers failed ({type(e).__name__}: {e})"
    return f"every worker emptied ({sum(bool(c) for c in cleared)} of {len(cleared)})"


def router_state_path(checkpoint_folder: str) -> str:
    return os.path.join(checkpoint_folder, STORE_DIR, ROUTER_STATE)


def save_router_state(checkpoint_folder: str) -> None:
    """Our router's memory of which replica served each prompt, beside the stores (where they are)."""
    import ray

    router = tracking.rollout_router()
    if router is None:
        return
    path = router_state_path(checkpoint_folder)
    try:
        prompts = ray.get(router.save_state.remote(path), timeout=RPC_TIMEOUT_S)
        print(f"[sam] router state: saved {prompts} prompts' replicas to {path}", flush=True)
    except Exception as e:
        logger.error("SAM router state NOT saved to %s: %s; a resume routes by the hash ring alone", path, e)


def load_router_state(checkpoint_folder: str) -> None:
    import ray

    router = tracking.rollout_router()
    if router is None:
        return
    path = router_state_path(checkpoint_folder)
    try:
        loaded = ray.get(router.load_state.remote(path), timeout=RPC_TIMEOUT_S)
    except Exception as e:
        loaded = {"prompts": 0, "warning": f"{type(e).__name__}: {e}"}
    if loaded["warning"] is None:
        print(f"[sam] router state: loaded {loaded['prompts']} prompts' replicas from {path}", flush=True)
    else:
        print(f"[sam] WARNING: router state starts empty (routing by the hash ring): {loaded['warning']}", flush=True)


def _results(refs: dict) -> dict:
    """ray.get of each ref; an exception in place of a result that did not come."""
    import ray

    out = {}
    for key, ref in refs.items():
        try:
            out[key] = ray.get(ref, timeout=RPC_TIMEOUT_S)
        except Exception as e:
            out[key] = e
    return out


def _failure(per_worker) -> str:
    return (
        f"{type(per_worker).__name__}: {per_worker}" if isinstance(per_worker, Exception) else "no worker has a store"
    )


def _never_raise(step, trainer) -> None:
    try:
        step(trainer)
    except Exception:  # the checkpoint itself is done: its SAM part must never stop training
        logger.exception("SAM prompt store step %s failed; training goes on", step.__name__)
