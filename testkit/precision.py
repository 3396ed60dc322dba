"""Precision check: is the verify path bit-exact with the decode path?

Speculative decoding is lossless in exact arithmetic. In floating point, verifying k+1 tokens per
request in one pass (the verify path) may round differently from generating one token per pass (the
decode path). For each dtype this runs the same greedy prompts
- through the decode path: plain generation, with the chosen tokens' logprobs;
- through the verify path: generation with the SAM drafter on (threshold off, so every step verifies
  drafts), with the same logprobs;
- and, as a second multi-token path, through prefill: the prompt plus the decode path's output scored
  in one pass (prompt logprobs).
It reports the largest logprob difference over the tokens both paths share, and the first token where
the greedy outputs diverge.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from sam_rollout.engine_kwargs import sam_engine_kwargs
from testkit.vllm_tools import shutdown


@dataclass
class PathComparison:
    dtype: str
    path: str  # "verify (SAM k=3)" or "prefill"
    max_logprob_diff: float
    tokens_compared: int
    first_divergence: tuple[int, int] | None  # (prompt index, token index) or None

    @property
    def bit_exact(self) -> bool:
        return self.first_divergence is None and self.max_logprob_diff == 0.0

    def as_dict(self) -> dict:
        return asdict(self) | {"bit_exact": self.bit_exact}


def _chosen_logprobs(output) -> list[float]:
    return [step[token].logprob for token, step in zip(output.token_ids, output.logprobs)]


def greedy_with_logprobs(llm, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their logprobs, per prompt, from an engine (the decode or the verify path)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0)
    outs = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    return [(list(o.token_ids), _chosen_logprobs(o)) for o in outs]


@dataclass
class DecodePath:
    """A plain engine's greedy tokens with their logprobs, and the same tokens scored in one prefill."""

    generated: list[tuple[list[int], list[float]]]
    prefill: list[list[tuple[float, int]]]  # (logprob, rank) per generated token


def decode_path(llm, prompts: list[list[int]], max_tokens: int) -> DecodePath:
    """The reference paths, from an engine without speculation."""
    generated = greedy_with_logprobs(llm, prompts, max_tokens)
    return DecodePath(generated, _score(llm, prompts, [tokens for tokens, _ in generated]))


def _score(llm, prompts: list[list[int]], generated: list[list[int]]):
    """Logprob and rank of each generated token when prompt + generation is prefilled in one pass."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0)
    full = [p + g for p, g in zip(prompts, generated)]
    outs = llm.generate([{"prompt_token_ids": f} for f in full], params, use_tqdm=False)
    scores = []
    for prompt, gen, out in zip(prompts, generated, outs):
        steps = out.prompt_logprobs[len(prompt) :]
        scores.append([(step[token].logprob, step[token].rank) for token, step in zip(gen, steps)])
    return scores


def _compare(reference, other_tokens, other_logprobs) -> tuple[float, int, tuple[int, int] | None]:
    worst, compared, first = 0.0, 0, None
    for i, ((ref_tokens, ref_lp), tokens, lp) in enumerate(zip(reference, other_tokens, other_logprobs)):
        same = 0
        while same < min(len(ref_tokens), len(tokens)) and ref_tokens[same] == tokens[same]:
            same += 1
        if first is None and (same < len(ref_tokens) or len(tokens) != len(ref_tokens)):
            first = (i, same)
        for a, b in zip(ref_lp[:same], lp[:same]):
            if not (math.isinf(a) and math.isinf(b)):
                worst = max(worst, abs(a - b))
        compared += same
    return worst, compared, first


def compare_paths(dtype: str, k: int, decode: DecodePath, verify) -> list[PathComparison]:
    """The verify path (greedy tokens and logprobs of an engine drafting k) and the prefill path against
    the decode path."""
    reference = decode.generated
    worst, compared, first = _compare(reference, [t for t, _ in verify], [lp for _, lp in verify])
    out = [PathComparison(dtype, f"verify (SAM k={k})", worst, compared, first)]
    prefill = decode.prefill
    worst, compared, _ = _compare(reference, [t for t, _ in reference], [[lp for lp, _ in row] for row in prefill])
    # Prefill scores the decode path's own tokens: a token that is not its position's argmax there
    # (rank > 1) is where a greedy rollout through this path would diverge.
    first = next(((i, j) for i, row in enumerate(prefill) for j, (_, rank) in enumerate(row) if rank != 1), None)
    out.append(PathComparison(dtype, "prefill", worst, compared, first))
    return out


def check_dtype(model: str, prompts: list[list[int]], dtype: str, max_tokens: int, k: int = 3) -> list[PathComparison]:
    """One engine after the other (a large model may fit only once): plain, then with SAM."""
    from vllm import LLM

    base = dict(dtype=dtype, max_model_len=4096, enforce_eager=True, seed=0, kv_cache_memory_bytes=1 << 30)
    llm = LLM(model, **base)
    decode = decode_path(llm, prompts, max_tokens)
    shutdown(llm)
    llm = LLM(model, **base, **sam_engine_kwargs(k, switch=None))  # the verify path: drafts in every step
    verify = greedy_with_logprobs(llm, prompts, max_tokens)
    shutdown(llm)
    return compare_paths(dtype, k, decode, verify)
