"""Memory of a vLLM engine under one large GRPO group: n siblings of one prompt, sampled to a fixed length.

Library part of ``scripts/measure_group_memory.py``. Each setting (``benchmarks.engine.SETTINGS``: none,
ngram, sam, ...) gets a fresh engine; while it generates, a thread samples the resident memory (RSS)
of the engine's processes (the engine core and its worker: this process's children) every
``sample_every_s``. SAM's own bytes (``drafter_nbytes``, its peak in ``peak_drafter_nbytes``) come from
``sam_spec_metrics``. The KV cache is a fixed allocation (``kv_cache_memory_bytes``), so growth beyond
the first samples is what the engine allocates per step.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from dataclasses import dataclass

import psutil

from benchmarks.engine import SETTINGS
from benchmarks.vllm_tools import shutdown


@dataclass
class GroupWorkload:
    siblings: int = 256
    tokens: int = 2048
    temperature: float = 1.0


class RssSampler:
    """RSS of this process's children (vLLM's engine core and worker) every ``every_s`` seconds."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.samples: list[tuple[float, int]] = []  # (seconds since start, bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.perf_counter()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        me = psutil.Process()
        while not self._stop.wait(self.every_s):
            total = 0
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += child.memory_info().rss
            self.samples.append((time.perf_counter() - self._t0, total))


def measure(
    setting: str, model_dir: str, prompt_ids: list[int], wl: GroupWorkload, engine_kw: dict, sample_every_s: float = 2.0
) -> dict:
    """Generate one group under a setting; RSS over time, its peak and growth, SAM's bytes."""
    from vllm import LLM, SamplingParams

    spec, extra, desc = SETTINGS[setting]
    kw = dict(engine_kw)
    if spec is not None:
        kw["speculative_config"] = copy.deepcopy(spec)
    if extra is not None:
        kw["additional_config"] = copy.deepcopy(extra)
    llm = LLM(model_dir, **kw)
    try:
        params = SamplingParams(n=wl.siblings, temperature=wl.temperature, max_tokens=wl.tokens, ignore_eos=True)
        t0 = time.perf_counter()
        with RssSampler(sample_every_s) as rss:
            outs = llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        sam = None
        if spec is not None and spec.get("method") == "custom_class":
            (sam,) = llm.collective_rpc("sam_spec_metrics")
    finally:
        shutdown(llm)
    series = rss.samples
    peak = max((b for _, b in series), default=0)
    tenth = max(1, len(series) // 10)
    early = max(b for _, b in series[:tenth]) if series else 0
    return {
        "setting": setting,
        "description": desc,
        "seconds": round(seconds, 1),
        "output_tokens": tokens,
        "rss_peak_gib": round(peak / 2**30, 3),
        "rss_first_tenth_peak_gib": round(early / 2**30, 3),
        "rss_growth_after_first_tenth_gib": round((peak - early) / 2**30, 3),
        "rss_series": [(round(t, 1), round(b / 2**30, 3)) for t, b in series],
        "sam_peak_drafter_mib": round(sam["peak_drafter_nbytes"] / 2**20, 2) if sam else None,
        "sam_drafter_mib_at_end": round(sam["drafter_nbytes"] / 2**20, 2) if sam else None,
    }
