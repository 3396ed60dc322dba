"""The host CPU as a verl platform: gloo collectives, shared-memory weight sync, Ray "GPU" slots as ranks."""

from __future__ import annotations

import contextlib
import gc
import os
import resource
from types import SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM_NAME = "cpu"
PLATFORM_ENV = "VERL_PLATFORM"  # verl's own switch: VERL_PLATFORM=cpu selects this platform
# verl's resource pools count Ray "GPU" (or "NPU") resources only. On a CPU, Ray starts with N fake
# GPU slots (ray_init.num_gpus, or `ray start --num-gpus N`): one slot is one trainer or rollout rank.
RAY_RESOURCE = "GPU"
VISIBLE_DEVICES_ENV = "VERL_CPU_VISIBLE_DEVICES"


def cpu_requested() -> bool:
    return os.environ.get(PLATFORM_ENV, "").strip().lower() == PLATFORM_NAME


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) host memory."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    return info["MemAvailable"], info["MemTotal"]


def _noop(*args, **kwargs) -> None:
    return None


class _CpuDeviceModule(SimpleNamespace):
    """What verl calls on ``get_torch_device()``. ``torch.cpu`` lacks empty_cache, ipc_collect, memory
    statistics and RNG state; memory statistics are this process's resident set (so verl's
    perf/max_memory_* metrics report host memory). Anything else comes from ``torch.cpu``."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)


CPU_DEVICE_MODULE = _CpuDeviceModule(
    is_available=lambda: True,
    is_initialized=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: "cpu",
    set_device=_noop,
    synchronize=_noop,
    empty_cache=lambda: gc.collect() and None,
    ipc_collect=_noop,
    reset_peak_memory_stats=_noop,
    set_per_process_memory_fraction=_noop,
    memory_allocated=lambda device=None: _rss_bytes(),
    memory_reserved=lambda device=None: _rss_bytes(),
    max_memory_allocated=lambda device=None: _peak_rss_bytes(),
    max_memory_reserved=lambda device=None: _peak_rss_bytes(),
    mem_get_info=_mem_get_info,
    get_rng_state=lambda device=None: torch.get_rng_state(),
    set_rng_state=lambda state, device=None: torch.set_rng_state(state),
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_device_name=lambda device=None: "cpu",
)


class PlatformCPU(PlatformBase):
    """Selected by ``VERL_PLATFORM=cpu`` only."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return cpu_requested()  # never auto-detected

    def current_device(self):
        return "cpu"  # verl feeds it to .to(...) and torch.device(...)

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # CUDA allocator settings

    def empty_cache(self) -> None:
        gc.collect()

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return VISIBLE_DEVICES_ENV

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return RAY_RESOURCE

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False  # no CUDA IPC: verl sends the actor's weights to vLLM through shared memory

    def rollout_env_vars(self) -> dict[str, str]:
        return {}

    def get_collective_module(self) -> Any:
        return None

    def cudart(self) -> Any:
        return None


def register_platform() -> None:
    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
