"""Where the pipeline's device ops run, and how the host waits for them.

A stream takes device ops in order (``launch``) and gives the host events to wait on (``record``: an
event is reached once every op launched before it has run). Two here:
- ``CudaStream``: the current CUDA stream; an op is a torch or Triton call, which enqueues itself.
- ``ImmediateStream``: CPU tensors; an op runs when it is launched, so every event is already reached.

The engine-free harness (``testkit.simulated_device``) adds a third, a device thread one step behind the
host, to test the pipeline with the host ahead of the device as on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


class Event(Protocol):
    def synchronize(self) -> None: ...


class DeviceStream(Protocol):
    device: torch.device

    def launch(self, op: Callable[..., object], *args) -> None: ...

    def record(self) -> Event: ...


class _Reached:
    def synchronize(self) -> None:
        pass


class ImmediateStream:
    """CPU tensors: ops run at launch."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def launch(self, op: Callable[..., object], *args) -> None:
        op(*args)

    def record(self) -> Event:
        return _Reached()


class CudaStream:
    """The current CUDA stream of ``device``: ops enqueue themselves there; events are CUDA events, whose
    ``synchronize`` releases the GIL while it waits."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)

    def launch(self, op: Callable[..., object], *args) -> None:
        op(*args)

    def record(self) -> Event:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event


def stream_for(device: torch.device | str) -> DeviceStream:
    device = torch.device(device)
    if device.type == "cuda":
        return CudaStream(device)
    if device.type == "cpu":
        return ImmediateStream(device)
    raise ValueError(f"SAM's device-side drafts run on CUDA or CPU tensors, not on {device.type}")
