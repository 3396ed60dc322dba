"""Pinned host memory through which the device and the drafting thread pass each step, ``slots`` deep.

Per ring slot (step t uses slot t % slots):
- the plan (host -> device): each row's request-state slot, whether its window starts at 0 (a row the
  host has not read before) and, token by token, which row and which position of its window to read;
- the report (device -> host): each row's total length and tokens sampled this step, and the windows:
  a row's newest tokens (the whole history for a row read for the first time);
- the drafts (host -> device): ``[rows, width]`` token ids, and ``valid[slot]``, the step whose drafts
  they are (anything else: use fillers).
``posted`` is the last step whose drafts are written (it only grows); ``timed_out`` is set by a device
op that stopped waiting (``await_drafts``).

On CUDA every buffer is page-locked host memory that kernels read and write in place through a device
view (unified virtual addressing: the host pointer is a valid device pointer), so the device's report
needs no copy and the host's drafts need none either. On the CPU the views are the buffers.
"""

from __future__ import annotations

import numpy as np
import torch


class _CudaArrayInterface:
    """What ``torch.as_tensor`` takes to view memory at a device address without copying."""

    def __init__(self, tensor: torch.Tensor):
        self.__cuda_array_interface__ = {
            "shape": tuple(tensor.shape),
            "typestr": tensor.numpy().dtype.str,
            "data": (tensor.data_ptr(), False),
            "strides": None,  # contiguous
            "version": 2,
        }


def device_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (contiguous; pinned on CUDA) as a tensor on ``device`` sharing its memory."""
    if device.type == "cpu":
        return host
    if not host.is_pinned():
        raise ValueError("a device view needs page-locked (pinned) host memory")
    return torch.as_tensor(_CudaArrayInterface(host), device=device)


class PinnedBuffer:
    """A host array (numpy, for the drafting thread) and its device view (for device ops)."""

    def __init__(self, shape, dtype: torch.dtype, device: torch.device):
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=device.type == "cuda")
        self.np = self.host.numpy()
        self.dev = device_view(self.host, device)


class StepRing:
    def __init__(self, slots: int, max_rows: int, width: int, device: torch.device | str, window_tokens: int = 0):
        if slots < 2:
            raise ValueError(f"a step ring needs at least 2 slots, got {slots}")
        self.slots, self.max_rows, self.width = int(slots), int(max_rows), int(width)
        self.device = torch.device(device)
        rows = (self.slots, self.max_rows)
        self.request_slot = PinnedBuffer(rows, torch.int64, self.device)  # plan: request-state slot of each row
        self.from_start = PinnedBuffer(rows, torch.bool, self.device)  # plan: window starts at position 0
        self.total_len = PinnedBuffer(rows, torch.int32, self.device)  # report
        self.num_sampled = PinnedBuffer(rows, torch.int32, self.device)  # report
        self.drafts = PinnedBuffer((*rows, max(self.width, 1)), torch.int64, self.device)
        self.valid = PinnedBuffer(self.slots, torch.int64, self.device)
        self.posted = PinnedBuffer(1, torch.int64, self.device)
        self.timed_out = PinnedBuffer(1, torch.int64, self.device)  # a step the device stopped waiting for
        self.valid.np[:] = -1
        self.posted.np[0] = -1
        self.timed_out.np[0] = -1
        capacity = max(int(window_tokens), 64)
        self._window: list[dict[str, PinnedBuffer]] = [self._window_buffers(capacity) for _ in range(self.slots)]

    def _window_buffers(self, capacity: int) -> dict[str, PinnedBuffer]:
        return {
            "row": PinnedBuffer(capacity, torch.int64, self.device),  # plan: the row of each token read
            "offset": PinnedBuffer(capacity, torch.int64, self.device),  # plan: its position in the row's window
            "tokens": PinnedBuffer(capacity, torch.int32, self.device),  # report
        }

    def window(self, slot: int, tokens: int) -> dict[str, PinnedBuffer]:
        """Slot ``slot``'s window buffers, grown to hold ``tokens`` (only while no device op uses it)."""
        buffers = self._window[slot]
        if buffers["row"].np.size < tokens:
            buffers = self._window[slot] = self._window_buffers(max(tokens, 2 * buffers["row"].np.size))
        return buffers


def window_plan(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For windows of ``counts[i]`` tokens, row by row: each token's row and its offset in its window."""
    total = int(counts.sum())
    rows = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return rows, offsets
