"""vllm-ascend 0.11.0's three Python-loop rejection-sampler helpers, as vectorised ``sam_rollout.rejection``
wrappers with the same signatures: what ``benchmarks.bench_rejection`` times against the loops (and
checks token for token). They were a patch on vllm-ascend up to 0.13.0rc1, removed because no supported
vllm-ascend needs it (docs/patches.md, "Removed").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sam_rollout.rejection import expand_batch_to_tokens, rejection_random_sample, sample_recovered_tokens


def expand_pytorch_vectorised(
    output_ptr: torch.Tensor,  # [num_tokens]
    input_ptr: torch.Tensor,  # [batch_size]
    cu_num_tokens_ptr: torch.Tensor,  # [batch_size]
    replace_from: int | float,
    replace_to: int | float,
    MAX_NUM_TOKENS: int,  # noqa: N803 - vllm-ascend's name; unused, no per-request cap is needed
) -> None:
    """In place: ``output_ptr[t] = input_ptr[request of t]`` with ``replace_from -> replace_to``."""
    output_ptr.copy_(
        expand_batch_to_tokens(input_ptr, cu_num_tokens_ptr, output_ptr.shape[0], replace_from, replace_to)
    )


def sample_recovered_tokens_pytorch_vectorised(
    output_token_ids: torch.Tensor,  # [num_tokens]
    cu_num_draft_tokens: torch.Tensor,  # [batch_size]
    draft_token_ids: torch.Tensor,  # [num_tokens]
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab_size] or None
    target_probs: torch.Tensor,  # [num_tokens, vocab_size]
    q: torch.Tensor,  # [batch_size, vocab_size] Exp(1) noise
    vocab_size: int,
    IS_NGRAM: bool = False,  # noqa: N803 - vllm-ascend's name
) -> None:
    """In place: ``output_token_ids[t] = argmax(residual_t / q[request of t])``.

    Unlike the loop, ``target_probs`` is never written to, not even temporarily.
    """
    del vocab_size  # implied by the tensors
    recovered = sample_recovered_tokens(
        cu_num_draft_tokens, draft_token_ids, None if IS_NGRAM else draft_probs, target_probs, q
    )
    output_token_ids.copy_(recovered)


def rejection_random_sample_pytorch_vectorised(
    output_token_ids: torch.Tensor,  # [batch_size, max_spec_len + 1]
    cu_num_draft_tokens: torch.Tensor,  # [batch_size]
    draft_token_ids: torch.Tensor,  # [num_tokens]
    draft_probs: torch.Tensor | None,  # [num_tokens, vocab_size] or None
    target_probs: torch.Tensor,  # [num_tokens, vocab_size]
    bonus_token_ids: torch.Tensor,  # [batch_size, 1]
    recovered_token_ids: torch.Tensor,  # [num_tokens]
    uniform_probs: torch.Tensor,  # [num_tokens] float64
    is_greedy: torch.Tensor | None,  # [batch_size] bool
    max_spec_len: int,
    vocab_size: int,
    IS_NGRAM: bool = False,  # noqa: N803 - vllm-ascend's name
) -> None:
    """In place on the non-greedy rows of ``output_token_ids``; same tokens as the loop."""
    del max_spec_len, vocab_size  # implied by the tensors
    rejection_random_sample(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        None if IS_NGRAM else draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
    )


# vllm-ascend function name -> its vectorised wrapper (the v0.11.0 original's parameter names)
REPLACEMENTS: dict[str, Callable[..., None]] = {
    "expand_pytorch": expand_pytorch_vectorised,
    "sample_recovered_tokens_pytorch": sample_recovered_tokens_pytorch_vectorised,
    "rejection_random_sample_pytorch": rejection_random_sample_pytorch_vectorised,
}
