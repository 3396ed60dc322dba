"""SAM's prompt stores in verl's checkpoints: saved with every checkpoint, loaded on resume.

verl 0.9.1's V1 trainer (``verl.trainer.ppo.v1.trainer_base.PPOTrainer``) saves a checkpoint in
``_save_checkpoint`` and resumes in ``_load_checkpoint``, which its setup calls once the rollout
servers run. ``wrap()`` wraps both (idempotent); ``install()``, called by ``rollout.verl.hook`` in every
Ray worker, has it done when a process (the trainer's) imports that module:

- after a save, every rollout replica with the prompt store on writes its store to
  ``<default_local_dir>/global_step_<N>/sam_prompt_store/rollout_<replica_rank>.npz``
  (docs/prompt-store.md); as verl does for the actor, only this run's newest
  ``trainer.max_actor_ckpt_to_keep`` checkpoints keep theirs;
- after a resume from ``global_step_<N>``, every such replica loads its rank's file. A replica keeps its
  rank across restarts and the router sends a prompt to the same rank, so rank r's file is rank r's;
- our router's memory of which replica ranks served each prompt (``router.json``) is saved and loaded
  beside the stores, so a prompt the load bound had moved goes back to where its responses are.

The engines' workers read and write the files, so paths are absolute and the folder must be one they
can reach. Nothing here stops training: a store that cannot be saved is logged as an error, one that
cannot be loaded is reported as a warning, and that replica's store starts empty.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from typing import Any

from rollout.import_hooks import after_import
from rollout.verl import tracking

logger = logging.getLogger(__name__)

TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"
_MARK = "__sam_spec_wrapped__"
STORE_DIR = "sam_prompt_store"
ROUTER_STATE = "router.json"  # rollout.verl.router.SamLoadBalancer.save_state, beside the stores
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


def store_path(checkpoint_folder: str, replica_rank: int) -> str:
    return os.path.join(checkpoint_folder, STORE_DIR, f"rollout_{replica_rank}.npz")


def checkpoints_kept(trainer_config) -> int | None:
    """How many checkpoints verl keeps (its actor's rule); None: all."""
    if trainer_config.get("remove_previous_ckpt_in_save", False):
        return 1
    return trainer_config.get("max_actor_ckpt_to_keep", None)


# -- which replicas, and the calls ------------------------------------------------------------------
def prompt_store_replicas(trainer) -> list:
    """The trainer's rollout replicas (those of every rollout server manager) with the store on."""
    managers = trainer._rollout_server_managers()  # verl's list of the managers that serve rollout
    replicas = [r for m in managers for r in m.get_replicas()]
    return [r for r in replicas if getattr(r, "sam_prompt_store", False) and r.servers]


def save_prompt_stores(replicas: Iterable[Any], checkpoint_folder: str) -> None:
    """Each replica's first server (node rank 0 owns the engine) saves its store; one line each."""
    paths = {r.replica_rank: store_path(checkpoint_folder, r.replica_rank) for r in replicas}
    refs = {r.replica_rank: r.servers[0].sam_save_prompt_store.remote(paths[r.replica_rank]) for r in replicas}
    for rank, per_worker in _results(refs).items():
        saved = next((w for w in per_worker if w), None) if isinstance(per_worker, list) else None
        if saved is not None and "error" not in saved:
            print(
                f"[sam] prompt store of rollout replica {rank}: saved {saved['prompts']} prompts, "
                f"{saved['tokens']} tokens ({saved['file_bytes'] / 2**20:.1f} MiB) to {saved['path']}",
                flush=True,
            )
        else:
            reason = saved["error"] if saved is not None else _failure(per_worker)
            logger.error(
                "SAM prompt store of rollout replica %d NOT saved to %s: %s. The checkpoint is otherwise "
                "complete; a resume from it starts this replica with an empty prompt store.",
                rank,
                paths[rank],
                reason,
            )


def load_prompt_stores(replicas: Iterable[Any], checkpoint_folder: str) -> None:
    """Each replica's engine loads its rank's file into every worker; one line each."""
    paths = {r.replica_rank: store_path(checkpoint_folder, r.replica_rank) for r in replicas}
    refs = {r.replica_rank: r.servers[0].sam_load_prompt_store.remote(paths[r.replica_rank]) for r in replicas}
    for rank, per_worker in _results(refs).items():
        loaded = [w for w in per_worker if w] if isinstance(per_worker, list) else []
        warning = next((w["warning"] for w in loaded if w["warning"]), None)
        if loaded and warning is None:
            print(
                f"[sam] prompt store of rollout replica {rank}: loaded {loaded[0]['prompts']} prompts, "
                f"{loaded[0]['tokens']} tokens from {paths[rank]} into {len(loaded)} worker(s)",
                flush=True,
            )
        else:
            reason = warning or _failure(per_worker)
            # printed: importing vLLM's API server sets the root logger and its handlers to ERROR
            # (model_hosting_container_standards), which would swallow a logged warning here
            print(f"[sam] WARNING: prompt store of rollout replica {rank} starts empty: {reason}", flush=True)


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
