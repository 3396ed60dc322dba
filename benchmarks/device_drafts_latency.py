"""What SAM's device-side drafting costs a step, without vLLM: the engine-free harness
(``testkit.simulated_device.AsyncHarness``) on a real CUDA stream, a model step emulated by
``torch.cuda._sleep`` of a set length, the host ahead of the device as with async scheduling.

    python -m benchmarks.device_drafts_latency --json OUT.json              # CUDA
    python -m benchmarks.device_drafts_latency --json OUT.json --device cpu # the simulated device (tests)

Per emulated step length (2 ms: SmolLM2-135M on an H200; 20 ms: the Qwen3-32B anchor) and batch size,
three engines on the same texts: no speculator (``plain``), SAM's speculator with width 0 (``sam_nodraft``:
the report and the drafting thread run, nobody waits) and with width 3 (``sam_k3``: the device waits for
each step's drafts). Reported: ms per step and the difference to ``plain``; the k=3 engine's tokens per
step (its drafts do verify: the emulated model accepts what matches the text). First, a correctness
check on the device: every step's drafts as the device received them against synchronous drafting's.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from testkit.simulated_device import AsyncHarness, SimulatedStream, Workload

K = 3
MODES = {"plain": None, "sam_nodraft": {"switch": 0}, "sam_k3": {"switch": None}}


def stream_for_bench(device: str):
    if device == "cuda":
        from sam_rollout.device_drafts.streams import CudaStream

        return CudaStream("cuda")
    return SimulatedStream()


def correctness(device: str, steps: int, requests: int) -> dict:
    harness = AsyncHarness(
        Workload.periodic(requests, steps, seed=7), K, {"switch": None}, stream_for_bench(device), max_rows=requests
    )
    try:
        harness.run(steps)
        reference = harness.reference_drafts()
        received = [x.cpu().numpy() for x in harness.received]
    finally:
        harness.close()
    equal = len(reference) == len(received) and all(np.array_equal(a, b) for a, b in zip(reference, received))
    return dict(steps_compared=len(received), equal_at_every_step=bool(equal))


def time_mode(device: str, mode: str, batch: int, step_s: float, steps: int, warm: int) -> dict:
    spec = MODES[mode]
    harness = AsyncHarness(
        Workload.steady(batch, warm + steps, seed=batch),
        K,
        spec or {"switch": 0},
        stream_for_bench(device),
        max_rows=batch,
        step_time_s=step_s,
        speculate=spec is not None,
    )
    try:
        harness.run(warm)
        committed_before = sum(int(x.sum()) for x in harness.sampled)
        wall = harness.run(steps)
        committed = sum(int(x.sum()) for x in harness.sampled) - committed_before
    finally:
        harness.close()
    return dict(
        mode=mode,
        batch=batch,
        step_ms=round(1e3 * wall / steps, 4),
        tokens_per_step=round(committed / (steps * batch), 3),
    )


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--step-ms", default="2,20", help="emulated model step lengths, ms")
    args = p.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    step_lengths = [float(x) / 1e3 for x in args.step_ms.split(",")]
    out = dict(device=args.device, torch=torch.__version__, host=platform.processor() or platform.machine())
    if args.device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    out["correctness"] = correctness(args.device, steps=80, requests=8)
    print(f"[device_drafts] correctness: {out['correctness']}")
    out["rows"] = []
    for step_s in step_lengths:
        for batch in batches:
            rows = {m: time_mode(args.device, m, batch, step_s, args.steps, warm=30) for m in MODES}
            for row in rows.values():
                row["emulated_step_ms"] = 1e3 * step_s
                row["minus_plain_ms"] = round(row["step_ms"] - rows["plain"]["step_ms"], 4)
                row["x_plain"] = round(rows["plain"]["step_ms"] / row["step_ms"], 4)
                out["rows"].append(row)
            print(f"[device_drafts] step {1e3 * step_s} ms, batch {batch}: " + ", ".join(
                f"{m} {r['step_ms']} ms" for m, r in rows.items()))  # fmt: skip
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    out["seconds"] = round(time.process_time(), 1)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
