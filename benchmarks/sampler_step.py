"""What vLLM's sampling costs in a step without drafts: the plain sampler, the rejection sampler as
released, and the rejection sampler with ``sam_rollout.vllm.undrafted_steps``.

An engine with speculation configured samples every step through ``RejectionSampler.forward``. In a
step where no request has drafts, all three return the same token; the difference in time is what
merely configuring speculation costs a step. Run it in a process with vLLM's CPU kernels bound
(``testkit.vllm_tools.bind_cpu_kernels``) and with the CPU guards the plugin installs.
"""

from __future__ import annotations

import statistics
import time

from testkit.vllm_tools import sampling_metadata, spec_metadata

SMOLLM2_VOCAB = 49152


def time_undrafted_step(batch: int, *, vocab: int, greedy: bool, repeats: int, dtype: str = "float32") -> dict:
    """Median ms of sampling one step without drafts: plain, released and patched, interleaved."""
    import torch
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from sam_rollout.vllm.undrafted_steps import plain_sampling_without_drafts

    released = getattr(RejectionSampler.forward, "original", RejectionSampler.forward)
    patched = plain_sampling_without_drafts(released)
    sampler = Sampler()
    rejection = RejectionSampler(sampler)
    meta = spec_metadata([[] for _ in range(batch)])
    sampling = sampling_metadata(batch, greedy=greedy)
    logits = torch.randn(batch, vocab, dtype=getattr(torch, dtype))
    calls = {
        "plain": lambda x: sampler(logits=x, sampling_metadata=sampling),
        "released": lambda x: released(rejection, meta, None, x, sampling),
        "patched": lambda x: patched(rejection, meta, None, x, sampling),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats + 3):  # the first three warm the allocator
        for name, call in calls.items():
            x = logits.clone()  # the samplers may write into their logits
            start = time.perf_counter()
            call(x)
            times[name].append((time.perf_counter() - start) * 1e3)
    ms = {name: statistics.median(t[3:]) for name, t in times.items()}
    return {
        "batch": batch,
        "vocab": vocab,
        "greedy": greedy,
        "dtype": dtype,
        "repeats": repeats,
        "ms": {k: round(v, 3) for k, v in ms.items()},
        "released_minus_plain_ms": round(ms["released"] - ms["plain"], 3),
        "patched_minus_plain_ms": round(ms["patched"] - ms["plain"], 3),
    }
