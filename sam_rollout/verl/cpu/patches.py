"""What verl 0.9.1 needs besides a platform to train on the CPU: small named patches (``verl_*`` in
docs/patches.md), applied by the verl plugin with ``VERL_PLATFORM=cpu`` (``sam_rollout.patches``; each
idempotent), and the check that refuses settings that cannot work on a CPU before Ray starts. Causes and
verl file references: docs/verl-cpu.md."""

from __future__ import annotations

import datetime
import os
import sys

from sam_rollout.patches import is_patched, mark, replace

WEIGHT_SYNC_TIMEOUT_ENV = "SAM_WEIGHT_SYNC_TIMEOUT_S"
PLAIN_GLOO = "verl_plain_gloo"


class CpuConfigError(ValueError):
    """A setting that cannot work on the CPU platform."""


def select_fsdp_engine() -> None:
    """verl registers its FSDP engine for cuda and npu; it runs on the CPU once the platform says "cpu",
    and verl's own override picks it."""
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")


def _plain_gloo(backend):
    """'cpu:gloo,cpu:gloo' (verl's "cpu:gloo,{device}:{backend}" with device cpu) -> 'gloo'."""
    if backend is None:
        return "gloo"
    parts = [p.split(":", 1) for p in str(backend).split(",")]
    return "gloo" if all(len(p) == 2 and p[0] == "cpu" for p in parts) else backend


def use_plain_gloo() -> None:
    """torch refuses verl's "cpu:gloo,cpu:gloo" (a duplicate device type): process groups use gloo."""
    import verl.utils.distributed as dist_utils

    if is_patched(dist_utils.initialize_global_process_group_ray, PLAIN_GLOO):
        return
    orig_ray = dist_utils.initialize_global_process_group_ray
    orig_global = dist_utils.initialize_global_process_group

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return orig_ray(timeout_second=timeout_second, backend=_plain_gloo(backend))

    def initialize_global_process_group(timeout_second=36000):
        import torch.distributed

        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(
                backend="gloo",
                timeout=datetime.timedelta(seconds=timeout_second),
                init_method=os.environ.get("DIST_INIT_METHOD", None),
            )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    replacements = {
        "initialize_global_process_group_ray": (
            orig_ray,
            mark(initialize_global_process_group_ray, orig_ray, PLAIN_GLOO),
        ),
        "initialize_global_process_group": (
            orig_global,
            mark(initialize_global_process_group, orig_global, PLAIN_GLOO),
        ),
    }
    # the module itself, and every verl module that already did `from verl.utils.distributed import ...`
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "verl" or name.startswith("verl.")):
            continue
        namespace = vars(module)
        for attr, (old, new) in replacements.items():
            if namespace.get(attr) is old:
                setattr(module, attr, new)


def bound_weight_sync_wait() -> None:
    """verl's weight sender waits for the vLLM worker's ack without a timeout, so a worker that dies
    during a sync hangs the trainer for good: give the socket a timeout and fail with a clear message."""
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as transfer

    timeout_s = float(os.environ.get(WEIGHT_SYNC_TIMEOUT_ENV, "600"))

    def with_timeouts(original_init_socket):
        def _init_socket(self):
            import zmq

            original_init_socket(self)
            for option in (zmq.RCVTIMEO, zmq.SNDTIMEO):
                self.socket.setsockopt(option, int(timeout_s * 1000))
            self.socket.setsockopt(zmq.LINGER, 0)

        return _init_socket

    def naming_the_cause(original_send):
        async def async_send_weights(self, weights):
            import zmq

            try:
                return await original_send(self, weights)
            except zmq.Again as e:
                raise RuntimeError(
                    f"weight sync to the vLLM worker got no answer in {timeout_s:.0f} s on {self.zmq_handle}: the "
                    f"rollout worker probably died while loading the weights (see its log); "
                    f"{WEIGHT_SYNC_TIMEOUT_ENV} sets the limit"
                ) from e

        return async_send_weights

    replace(transfer.BucketedWeightSender, "_init_socket", with_timeouts, "verl_weight_sync_timeout")
    replace(transfer.BucketedWeightSender, "async_send_weights", naming_the_cause, "verl_weight_sync_timeout")


def check_cpu_config(config, ray_address: str | None = None) -> None:
    """Refuse, naming the fix, what cannot work on the CPU platform (before Ray starts)."""
    problems = []
    rollout = config.actor_rollout_ref.rollout
    if rollout.get("free_cache_engine", True) or rollout.get("enable_sleep_mode", True):
        problems.append(
            "vLLM has no sleep mode on CPU: set actor_rollout_ref.rollout.free_cache_engine=false "
            "+actor_rollout_ref.rollout.enable_sleep_mode=false"
        )
    for role in ("actor", "ref"):
        if config.actor_rollout_ref.get(role, {}).get("strategy") == "megatron":
            problems.append(f"actor_rollout_ref.{role}.strategy=megatron does not run on CPU: use fsdp2")
    if config.trainer.get("device") != "cpu":
        problems.append(f"trainer.device must be cpu with VERL_PLATFORM=cpu, got {config.trainer.get('device')!r}")
    ray_init = config.get("ray_kwargs", {}).get("ray_init", {})
    if not (ray_address or os.environ.get("RAY_ADDRESS")) and not ray_init.get("num_gpus"):
        slots = config.trainer.n_gpus_per_node * config.trainer.nnodes
        problems.append(
            f"verl's resource pools count Ray 'GPU' slots; declare {slots} on CPU: "
            f"+ray_kwargs.ray_init.num_gpus={slots} (or `ray start --num-gpus N` and RAY_ADDRESS)"
        )
    if problems:
        raise CpuConfigError("VERL_PLATFORM=cpu: " + "; ".join(problems))


def check_config_on_validate() -> None:
    """Run check_cpu_config inside verl's validate_config, which the trainer calls before ray.init."""
    import verl.utils.config as config_utils

    def checking_cpu_config(original):
        def validate_config(config, *args, **kwargs):
            check_cpu_config(config)
            return original(config, *args, **kwargs)

        return validate_config

    replace(config_utils, "validate_config", checking_cpu_config, "verl_cpu_config_check")
