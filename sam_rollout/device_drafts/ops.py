"""The pipeline's two device ops, launched in stream order by the engine's thread:

- ``report_step``, at the end of step t: each row's total length and sampled count, and a window of its
  newest tokens, gathered from the engine's token history into the ring slot (the host reads them once
  the event recorded after it is reached);
- ``await_drafts``, before step t+1 reads its drafts: wait until the host has posted step t's drafts,
  then copy them into the engine's draft tensor. On CUDA a Triton kernel polls the posted step in
  pinned host memory; elsewhere the host polls it (on CPU tensors an op runs on the host anyway).
  Waiting has a bound: past it the op copies fillers (the row's last token, verified like any draft,
  so outputs stay exact) and records the step in ``ring.timed_out``, which the pipeline turns into an
  error, since tensor-parallel ranks must never verify different drafts.
"""

from __future__ import annotations

import functools
import os
import time

import torch

from sam_rollout.device_drafts.ring import StepRing

# a poll of pinned host memory from a GPU is a PCIe round trip, about 1 us: polls per second of waiting
POLLS_PER_SECOND = 1_000_000
HOST_POLL_S = 20e-6  # the host's poll interval where the op runs on the host
BLOCK_ROWS = 64


def report_step(
    ring: StepRing,
    slot: int,
    rows: int,
    window_tokens: int,
    buffers: dict,
    window: int,
    all_token_ids: torch.Tensor,
    total_len: torch.Tensor,
    num_sampled: torch.Tensor,
) -> None:
    """Device op: write step t's report into ring slot ``slot``. ``total_len`` and ``all_token_ids`` are
    indexed by request-state slot (the plan's ``request_slot``), ``num_sampled`` by batch row. A row's
    window ends at its total length and is ``window`` tokens long, or starts at 0 where the plan says so;
    token j of the flat window is position ``start[row[j]] + offset[j]`` of row ``row[j]``."""
    req = ring.request_slot.dev[slot, :rows]
    lengths = total_len[req]
    ring.total_len.dev[slot, :rows] = lengths
    ring.num_sampled.dev[slot, :rows] = num_sampled[:rows]
    if window_tokens == 0:
        return
    starts = torch.where(ring.from_start.dev[slot, :rows], 0, (lengths.to(torch.int64) - window).clamp_min(0))
    row = buffers["row"].dev[:window_tokens]
    position = (starts[row] + buffers["offset"].dev[:window_tokens]).clamp_max(all_token_ids.shape[1] - 1)
    buffers["tokens"].dev[:window_tokens] = all_token_ids[req[row], position]


def await_drafts(
    ring: StepRing, slot: int, step: int, rows: int, out: torch.Tensor, fill: torch.Tensor, timeout_s: float
) -> None:
    """Device op: ``out[:rows] = ring.drafts[slot, :rows]`` once ``ring.posted >= step`` and the slot holds
    that step's drafts (``ring.valid[slot] == step``); fillers ``fill[:rows]`` if not posted within
    ``timeout_s`` (then ``ring.timed_out = step``) or if the slot's drafts are not valid."""
    if out.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        _await_with_kernel(ring, slot, step, rows, out, fill, max(int(timeout_s * POLLS_PER_SECOND), 1))
    else:
        await_on_host(ring, slot, step, rows, out, fill, timeout_s)


def await_on_host(
    ring: StepRing, slot: int, step: int, rows: int, out: torch.Tensor, fill: torch.Tensor, timeout_s: float
) -> None:
    """``await_drafts`` where the op runs on the host (CPU tensors): the reference for the kernel."""
    deadline = time.monotonic() + timeout_s
    while ring.posted.np[0] < step and time.monotonic() < deadline:
        time.sleep(HOST_POLL_S)
    posted = ring.posted.np[0] >= step
    if posted and ring.valid.np[slot] == step:
        out[:rows] = ring.drafts.host[slot, :rows, : out.shape[1]].to(out.device)
    else:
        out[:rows] = fill[:rows, None].to(out.dtype)
    if not posted:
        ring.timed_out.np[0] = step


def _await_with_kernel(ring, slot, step, rows, out, fill, max_polls) -> None:
    if rows == 0:
        return
    width = out.shape[1]
    kernel = _kernel()
    grid = (_cdiv(rows, BLOCK_ROWS),)
    kernel[grid](
        ring.posted.dev,
        ring.valid.dev[slot:],
        ring.timed_out.dev,
        ring.drafts.dev[slot],
        fill,
        out,
        step,
        rows,
        width,
        ring.drafts.dev.stride(1),
        out.stride(0),
        max_polls,
        BLOCK_ROWS=BLOCK_ROWS,
        BLOCK_WIDTH=max(_next_power_of_2(width), 2),
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


@functools.cache
def _kernel():
    """The Triton kernel, made on first use: Triton is imported only where it runs (a GPU, or its
    interpreter with TRITON_INTERPRET=1 on CPU tensors, as the tests run it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def await_drafts_kernel(
        posted_ptr,
        valid_ptr,
        timed_out_ptr,
        drafts_ptr,
        fill_ptr,
        out_ptr,
        step,
        rows,
        width,
        drafts_stride,
        out_stride,
        max_polls,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_WIDTH: tl.constexpr,
    ):
        # every program polls the posted step itself (volatile: each load goes to host memory)
        seen = tl.load(posted_ptr, volatile=True)
        polls = 0
        while (seen < step) & (polls < max_polls):
            seen = tl.load(posted_ptr, volatile=True)
            polls += 1
        posted = seen >= step
        use = posted & (tl.load(valid_ptr, volatile=True) == step)
        row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        col = tl.arange(0, BLOCK_WIDTH)
        mask = (row[:, None] < rows) & (col[None, :] < width)
        drafts = tl.load(drafts_ptr + row[:, None] * drafts_stride + col[None, :], mask=mask, other=0, volatile=True)
        fill = tl.load(fill_ptr + row, mask=row < rows, other=0).to(drafts.dtype)
        tokens = tl.where(use, drafts, fill[:, None] + tl.zeros_like(drafts))
        tl.store(out_ptr + row[:, None] * out_stride + col[None, :], tokens, mask=mask)
        tl.store(timed_out_ptr, step, mask=seen < step)

    return await_drafts_kernel
