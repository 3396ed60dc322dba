"""Plain-loop speculative rejection sampling: the tests' reference, and the path ``sam_rollout.rejection`` takes for a
single request on an accelerator (fewer kernel launches there than the vectorised one).

The textbook algorithm, written one request and one position at a time:

    for each draft x_i with target p_i and draft q_i (point mass if absent):
        accept x_i with probability min(1, p_i(x_i) / q_i(x_i))
        on rejection emit a token from max(p_i - q_i, 0) normalised, and stop
    if every draft was accepted, emit the bonus token

It takes the same arguments as ``sam_rollout.rejection.rejection_sample`` and consumes
the same random numbers in the same order (per drafting, non-greedy request:
its uniforms, then one Exp(1) vector over the vocabulary, from its generator
when it has one, on the logits' device), so both implementations agree token for token when given
the same pre-drawn numbers or the same seeded generators. Only the recovered
token at the first rejection is computed, as the textbook does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

__all__ = ["GREEDY_TEMPERATURE", "PLACEHOLDER_TOKEN_ID", "rejection_sample_reference", "top_k_top_p_row"]

PLACEHOLDER_TOKEN_ID = -1
# Temperatures at or below this value mean greedy decoding. vLLM uses 0;
# vLLM up to ~0.11 (and vllm-ascend 0.11) stored greedy as -1, also covered.
GREEDY_TEMPERATURE = 0.0


def top_k_top_p_row(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Top-k then top-p mask on one ``[vocab_size]`` row of logits; returns a new row (or ``logits`` if neither).

    Same rule as ``sam_rollout.rejection.apply_top_k_top_p``: top-k keeps ties with
    the k-th largest logit (k <= 0 or >= vocab_size disables it); top-p drops
    tokens, smallest first, while the cumulative mass up to and including
    them stays ``<= 1 - top_p``, and never drops the most likely token.
    """
    if top_k is None and top_p is None:
        return logits
    vocab_size = logits.shape[0]
    sorted_logits, sorted_index = logits.sort(descending=False)
    if top_k is not None and 0 < top_k < vocab_size:
        kth_largest = sorted_logits[vocab_size - top_k]
        sorted_logits[sorted_logits < kth_largest] = float("-inf")
    if top_p is not None:
        cumulative_mass = sorted_logits.softmax(dim=0).cumsum(dim=0)
        outside_top_p = cumulative_mass <= 1 - torch.tensor(top_p, dtype=cumulative_mass.dtype)
        outside_top_p[-1] = False
        sorted_logits[outside_top_p] = float("-inf")
    masked = torch.empty_like(logits)
    masked[sorted_index] = sorted_logits
    return masked


def _target_distribution_row(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """Target probabilities ``[vocab_size]`` at one position of a non-greedy request."""
    scaled = logits.to(torch.float32) / torch.tensor(temperature, dtype=torch.float32)
    return top_k_top_p_row(scaled, top_k, top_p).softmax(dim=0)


def _greedy_request(draft_token_ids: list[int], target_logits: torch.Tensor, bonus_token_id: int) -> list[int]:
    """Tokens emitted for one greedy request: the argmax chain up to the first mismatch."""
    emitted = []
    for position, draft_token_id in enumerate(draft_token_ids):
        target_argmax = int(target_logits[position].to(torch.float32).argmax())
        emitted.append(target_argmax)
        if draft_token_id != target_argmax:
            return emitted
    emitted.append(bonus_token_id)
    return emitted


def _random_request(
    draft_token_ids: list[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_id: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    uniform_probs: torch.Tensor,
    recovery_noise: torch.Tensor,
) -> list[int]:
    """Tokens emitted for one non-greedy request (positions in order, stop at the first rejection)."""
    emitted = []
    for position, draft_token_id in enumerate(draft_token_ids):
        target_probs = _target_distribution_row(target_logits[position], temperature, top_k, top_p)
        if draft_token_id >= 0:
            target_prob = target_probs[draft_token_id].item()
            draft_prob = 1.0 if draft_probs is None else draft_probs[position, draft_token_id].item()
            if draft_prob > 0 and target_prob / draft_prob >= uniform_probs[position].item():
                emitted.append(draft_token_id)
                continue
        if draft_probs is None:
            residual = target_probs.clone()
            if draft_token_id >= 0:
                residual[draft_token_id] = 0.0
        else:
            residual = torch.clamp_min(target_probs - draft_probs[position], 0.0)
        # Exponential race: argmax(residual / E) with E ~ Exp(1) iid draws v
        # with probability residual[v] / sum(residual).
        emitted.append(int((residual / recovery_noise).argmax()))
        return emitted
    emitted.append(bonus_token_id)
    return emitted


def rejection_sample_reference(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    generators: Mapping[int, torch.Generator] | None = None,
    uniform_probs: torch.Tensor | None = None,
    recovery_noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Loop version of ``sam_rollout.rejection.rejection_sample``; same arguments and shapes.

    Returns ``[batch_size, max_spec_len + 1]`` int32 padded with -1.
    ``cu_num_draft_tokens`` is accepted for signature parity; the loop uses
    ``num_draft_tokens``.
    """
    del cu_num_draft_tokens
    batch_size = len(num_draft_tokens)
    vocab_size = target_logits.shape[1]
    device = target_logits.device
    generators = generators or {}
    output_token_ids = torch.full((batch_size, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)

    start = 0
    for request in range(batch_size):
        num_drafts = num_draft_tokens[request]
        end = start + num_drafts
        drafts = draft_token_ids[start:end].tolist()
        bonus_token_id = int(bonus_token_ids.reshape(-1)[request])
        request_temperature = float(temperature[request])
        if request_temperature <= GREEDY_TEMPERATURE:
            emitted = _greedy_request(drafts, target_logits[start:end], bonus_token_id)
        else:
            generator = generators.get(request)
            if uniform_probs is not None:
                request_uniforms = uniform_probs[start:end]
            else:
                request_uniforms = torch.rand(num_drafts, dtype=torch.float64, device=device, generator=generator)
            if recovery_noise is not None:
                request_noise = recovery_noise[request]
            elif num_drafts > 0:
                request_noise = torch.empty(vocab_size, dtype=torch.float32, device=device)
                request_noise.exponential_(generator=generator)
            else:
                request_noise = None  # a request without drafts draws nothing
            emitted = _random_request(
                drafts,
                None if draft_probs is None else draft_probs[start:end],
                target_logits[start:end],
                bonus_token_id,
                request_temperature,
                None if top_k is None else int(top_k[request]),
                None if top_p is None else float(top_p[request]),
                request_uniforms,
                request_noise,
            )
        output_token_ids[request, : len(emitted)] = torch.tensor(emitted, dtype=torch.int32)
        start = end
    return output_token_ids.to(device)
