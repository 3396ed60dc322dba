"""Memory of a vLLM engine under one large GRPO group: n siblings of one prompt, sampled to a fixed length.

Library part of ``python -m benchmarks.measure_group_memory``. Each setting (``testkit.engine.SETTINGS``: none,
ngram, sam_group, ...) gets a fresh engine, which this module drives step by step
(``LLM.llm_engine.step()``) until the group is done or ``seconds`` have passed (then it aborts the
rest), and every ``sample_every_s``:
- the resident memory (RSS) of the engine's processes (the engine core and its worker: this process's
  children), and
- for SAM, the drafter's own bytes (``sam_spec_metrics``: ``drafter_nbytes``) and the requests it holds.
The KV cache is a fixed allocation (``kv_cache_memory_bytes``), so RSS growth after warm-up is what the
engine allocates as the group's responses grow.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass

import psutil

from testkit.engine import SETTINGS
from testkit.vllm_tools import shutdown


@dataclass
class GroupWorkload:
    siblings: int = 256
    tokens: int = 2048
    temperature: float = 1.0
    seconds: float = 480.0  # per setting; what is left then is aborted


def engine_rss() -> int:
    """Bytes resident in this process's children (vLLM's engine core and worker)."""
    total = 0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return total


def measure(
    setting: str,
    model_dir: str,
    prompt_ids: list[int],
    wl: GroupWorkload,
    engine_kw: dict,
    sample_every_s: float = 5.0,
) -> dict:
    """Generate one group under a setting, step by step; RSS and SAM's bytes over time."""
    from vllm import LLM, SamplingParams

    spec, extra, desc = SETTINGS[setting]
    kw = dict(engine_kw)
    if spec is not None:
        kw["speculative_config"] = copy.deepcopy(spec)
    if extra is not None:
        kw["additional_config"] = copy.deepcopy(extra)
    sam = spec is not None and spec.get("method") == "custom_class"
    llm = LLM(model_dir, **kw)
    samples = []
    try:
        engine = llm.llm_engine
        params = SamplingParams(temperature=wl.temperature, max_tokens=wl.tokens, ignore_eos=True)
        ids = [f"sibling-{i}" for i in range(wl.siblings)]
        for rid in ids:  # verl sends a group as n requests with one prompt
            engine.add_request(rid, {"prompt_token_ids": prompt_ids}, params)
        tokens, t0, next_sample = 0, time.perf_counter(), 0.0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens += len(out.outputs[0].token_ids)
            now = time.perf_counter() - t0
            if now >= next_sample:
                samples.append(snapshot(llm, now, sam))
                next_sample = now + sample_every_s
            if now >= wl.seconds:
                engine.abort_request(ids)
                break
        seconds = time.perf_counter() - t0
        samples.append(snapshot(llm, seconds, sam))
    finally:
        shutdown(llm)
    return summarize(setting, desc, wl, seconds, samples)


def snapshot(llm, seconds: float, sam: bool) -> dict:
    row = {"t": round(seconds, 1), "rss_gib": round(engine_rss() / 2**30, 3)}
    if sam:
        (m,) = llm.collective_rpc("sam_spec_metrics")
        row.update(drafter_mib=round(m["drafter_nbytes"] / 2**20, 2), live_requests=m["live_requests"],
                   decode_rows=m["decode_row_steps"])  # fmt: skip
    return row


def summarize(setting: str, desc: str, wl: GroupWorkload, seconds: float, samples: list[dict]) -> dict:
    warm = samples[min(2, len(samples) - 1)]["rss_gib"]  # after the first samples: weights, KV cache, warm-up
    peak = max(s["rss_gib"] for s in samples)
    drafter = [s["drafter_mib"] for s in samples if "drafter_mib" in s]
    return {
        "setting": setting,
        "description": desc,
        "siblings": wl.siblings,
        "tokens_each": wl.tokens,
        "seconds": round(seconds, 1),
        "rss_warm_gib": warm,
        "rss_peak_gib": peak,
        "rss_growth_after_warm_gib": round(peak - warm, 3),
        "sam_peak_drafter_mib": max(drafter) if drafter else None,
        "samples": samples,
    }
