"""Exact, vectorised rejection sampling for speculative decoding.

The algorithm is the one of Leviathan et al. (https://arxiv.org/abs/2211.17192),
laid out with vLLM's conventions (``vllm/v1/sample/rejection_sampler.py``):

* A batch of ``batch_size`` requests proposes ``num_tokens`` draft tokens in
  total, flattened request after request. ``cu_num_draft_tokens[i]`` is the
  number of draft tokens of requests ``0..i`` inclusive; a request may have none.
* Output is ``[batch_size, max_spec_len + 1]`` int32, padded with
  ``PLACEHOLDER_TOKEN_ID`` (-1): the accepted draft prefix, then either the
  recovered token at the first rejection or, if every draft was accepted, the
  bonus token.
* Draft probabilities may be absent (``None``): the draft is then a point mass
  on the proposed token ``x`` (model-free drafters such as n-gram or a suffix
  automaton). It is accepted with probability ``p(x)``; on rejection the
  recovered token is drawn from ``p`` with ``x`` removed, which is
  ``max(p - onehot(x), 0)`` normalised.
* A request whose temperature is ``<= GREEDY_TEMPERATURE`` is greedy: its
  output is the target argmax chain up to the first mismatch.

Randomness: per draft token one float64 uniform (accept test) and per request
one Exp(1) vector over the vocabulary (recovered-token race,
``argmax(residual / noise)``). Sharing one noise vector across a request's
positions is exact because only the recovered token at the first rejection is
ever emitted; for the same reason ``rejection_sample`` computes only that one.
Requests with a ``torch.Generator`` in ``generators`` draw from it, uniforms
first, then the noise, whenever they have draft tokens and are not greedy, so
their tokens do not depend on the rest of the batch or on the step's outcome.

No Python loop runs over requests or tokens. The only loops are over the
seeded requests' generators, which cannot be batched (as in vLLM), and, on a
CPU, over row tiles of a few MB (see ``CPU_TILE_BYTES``).

On an accelerator a call reads one device value on the host (the temperatures,
which pick the greedy and random paths; plus ``is_greedy`` when a seeded request
draws) and launches a few dozen kernels whatever the batch size: the draft layout
is built on the host from the Python draft counts and copied over once, and the
recovered token is computed for every request rather than for the ones a host
read would find rejecting. ``python -m benchmarks.bench_rejection --count-ops`` counts both.
A single request on an accelerator goes to the plain loop, which launches fewer
kernels there (``loop_is_cheaper``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

# the loop is the single-request path on accelerators; it owns the shared constants, so no import cycle
from sam_rollout.rejection_loop import GREEDY_TEMPERATURE, PLACEHOLDER_TOKEN_ID, rejection_sample_reference

__all__ = [
    "GREEDY_TEMPERATURE",
    "PLACEHOLDER_TOKEN_ID",
    "apply_sampling_constraints",
    "apply_top_k_top_p",
    "expand_batch_to_tokens",
    "generate_recovery_noise",
    "generate_uniform_probs",
    "rejection_greedy_sample",
    "rejection_random_sample",
    "rejection_sample",
    "sample_recovered_tokens",
]


# ---------------------------------------------------------------------------
# Index helpers
# ---------------------------------------------------------------------------


def _num_tokens_per_request(cu_num_tokens: torch.Tensor) -> torch.Tensor:
    """``[batch_size]`` cumulative counts -> ``[batch_size]`` per-request counts."""
    return torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))


def _token_request_and_position(cu_num_tokens: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request index and position within the request of every token.

    Returns two ``[num_tokens]`` int64 tensors.
    """
    batch_size = cu_num_tokens.shape[0]
    device = cu_num_tokens.device
    request_index = expand_batch_to_tokens(torch.arange(batch_size, device=device), cu_num_tokens, num_tokens)
    request_start = (cu_num_tokens - _num_tokens_per_request(cu_num_tokens)).long()
    position = torch.arange(num_tokens, device=device) - request_start[request_index]
    return request_index, position


def _scatter_to_grid(
    values: torch.Tensor,
    request_index: torch.Tensor,
    position: torch.Tensor,
    batch_size: int,
    width: int,
    fill_value: int | float | bool,
) -> torch.Tensor:
    """Place ``[num_tokens]`` values at ``[request, position]`` in a ``[batch_size, width]`` grid."""
    grid = values.new_full((batch_size, width), fill_value)
    grid[request_index, position] = values
    return grid


# ---------------------------------------------------------------------------
# Batch -> token expansion and sampling constraints
# ---------------------------------------------------------------------------


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: int | float = 0,
    replace_to: int | float = 0,
) -> torch.Tensor:
    """Repeat each request's value once per draft token.

    ``x``: ``[batch_size]``; ``cu_num_tokens``: ``[batch_size]`` cumulative
    counts; returns ``[num_tokens]`` with ``x.dtype``. Entries equal to
    ``replace_from`` become ``replace_to`` (vLLM uses this to turn the greedy
    temperature into 1 before dividing). Example: ``x = [a, b, c]``,
    ``cu_num_tokens = [2, 5, 6]`` gives ``[a, a, b, b, b, c]``.
    """
    assert x.shape[0] == cu_num_tokens.shape[0]
    replaced = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype), x)
    return torch.repeat_interleave(replaced, _num_tokens_per_request(cu_num_tokens), output_size=num_tokens)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask logits outside the top-k / top-p set with ``-inf`` (vLLM's PyTorch rule).

    ``logits``: ``[num_rows, vocab_size]`` (modified in place and returned);
    ``top_k``: ``[num_rows]`` ints, values ``<= 0`` or ``>= vocab_size`` disable it;
    ``top_p``: ``[num_rows]`` floats in ``(0, 1]``, 1 disables it.
    Top-k keeps every token tied with the k-th largest logit. Top-p then keeps
    the smallest high-probability set whose mass reaches ``top_p``: in
    ascending order a token is dropped when the cumulative mass up to and
    including it is ``<= 1 - top_p``; the most likely token is always kept.
    """
    if top_k is None and top_p is None:
        return logits
    vocab_size = logits.shape[-1]
    sorted_logits, sorted_index = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        k = top_k.long()
        k = torch.where((k <= 0) | (k > vocab_size), vocab_size, k)
        kth_largest = sorted_logits.gather(1, (vocab_size - k).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth_largest, float("-inf"))
    if top_p is not None:
        cumulative_mass = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        outside_top_p = cumulative_mass <= 1 - top_p.to(cumulative_mass.dtype).unsqueeze(1)
        outside_top_p[:, -1] = False
        sorted_logits.masked_fill_(outside_top_p, float("-inf"))
    return logits.scatter_(dim=-1, index=sorted_index, src=sorted_logits)


def apply_sampling_constraints(
    target_logits: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Temperature, then top-k / top-p, per request, on float32 logits.

    ``target_logits``: ``[num_tokens, vocab_size]`` (not modified);
    ``temperature``, ``top_k``, ``top_p``: ``[batch_size]``.
    Returns ``[num_tokens, vocab_size]`` float32 logits, new unless nothing
    changes them (then possibly ``target_logits`` itself; treat as read-only).
    Greedy requests are divided by 1, which keeps their argmax.
    """
    token_constraints = _expand_constraints(cu_num_draft_tokens, target_logits.shape[0], temperature, top_k, top_p)
    return _constrain_logits(target_logits, *token_constraints)


TokenConstraints = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _expand_constraints(
    cu_num_draft_tokens: torch.Tensor,
    num_tokens: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
) -> TokenConstraints:
    """Per-token temperature (greedy -> 1), top-k and top-p: ``[num_tokens]`` each (or None)."""
    temperature = temperature.to(torch.float32)
    safe_temperature = torch.where(temperature <= GREEDY_TEMPERATURE, 1.0, temperature)
    return (
        expand_batch_to_tokens(safe_temperature, cu_num_draft_tokens, num_tokens),
        None if top_k is None else expand_batch_to_tokens(top_k, cu_num_draft_tokens, num_tokens),
        None if top_p is None else expand_batch_to_tokens(top_p, cu_num_draft_tokens, num_tokens),
    )


def _constrain_logits(
    logits: torch.Tensor,
    token_temperature: torch.Tensor,
    token_top_k: torch.Tensor | None,
    token_top_p: torch.Tensor | None,
    scales: bool | None = None,
) -> torch.Tensor:
    """Rows of logits with their tokens' constraints applied; ``logits`` is not modified.

    ``scales``: whether any temperature differs from 1, when the caller knows it on the host
    (None: read it from ``token_temperature``, a host sync on an accelerator).
    """
    if scales is None:
        scales = not bool((token_temperature == 1.0).all())
    if token_top_k is None and token_top_p is None and not scales:
        # Dividing by 1 is the identity: skip a pass over the rows.
        return logits.to(torch.float32)
    scaled = logits.to(torch.float32) / token_temperature.unsqueeze(1)
    return apply_top_k_top_p(scaled, token_top_k, token_top_p)


def _take_constraints(constraints: TokenConstraints, rows: slice | torch.Tensor) -> TokenConstraints:
    return tuple(None if values is None else values[rows] for values in constraints)


# A CPU allocator maps a fresh [num_tokens, vocab_size] tensor page by page, which costs more than the
# softmax over it at batch 64 x k 3; tiles this small are reused from the heap instead. Accelerator
# allocators cache blocks, so there the rows go in one tile.
CPU_TILE_BYTES = 4 << 20


def _row_tiles(num_rows: int, vocab_size: int, device: torch.device) -> list[slice]:
    """Consecutive tiles of whole rows covering ``range(num_rows)`` (at least one, maybe empty)."""
    if device.type != "cpu" or num_rows == 0:
        return [slice(0, num_rows)]
    rows_per_tile = max(1, CPU_TILE_BYTES // (4 * vocab_size))
    return [slice(start, start + rows_per_tile) for start in range(0, num_rows, rows_per_tile)]


# ---------------------------------------------------------------------------
# Random numbers
# ---------------------------------------------------------------------------


def _seeded_requests_that_draw(
    generators: Mapping[int, torch.Generator],
    num_draft_tokens: Sequence[int],
    greedy_flags: Sequence[bool] | None,
) -> list[int]:
    """Seeded requests that consume random numbers this step: with drafts, not greedy."""
    return [
        request
        for request in sorted(generators)
        if num_draft_tokens[request] > 0 and not (greedy_flags and greedy_flags[request])
    ]


def _host_flags(is_greedy: torch.Tensor | None, generators: Mapping[int, torch.Generator]) -> list[bool] | None:
    """``is_greedy`` on the host, read only when a seeded request needs it."""
    return None if is_greedy is None or not generators else is_greedy.tolist()


def generate_uniform_probs(
    num_draft_tokens: Sequence[int],
    generators: Mapping[int, torch.Generator],
    device: torch.device | str,
    is_greedy: torch.Tensor | None = None,
) -> torch.Tensor:
    """One float64 uniform in [0, 1) per draft token: ``[num_tokens]``.

    float64, as in vLLM, because float32 ``rand`` returns exactly 0.0 often
    enough to matter. Seeded requests overwrite their slice from their generator.
    """
    return _uniform_probs(num_draft_tokens, generators, device, _host_flags(is_greedy, generators))


def _uniform_probs(
    num_draft_tokens: Sequence[int],
    generators: Mapping[int, torch.Generator],
    device: torch.device | str,
    greedy_flags: Sequence[bool] | None,
) -> torch.Tensor:
    uniform_probs = torch.rand(sum(num_draft_tokens), dtype=torch.float64, device=device)
    request_start = [0, *itertools.accumulate(num_draft_tokens)]
    for request in _seeded_requests_that_draw(generators, num_draft_tokens, greedy_flags):
        start, end = request_start[request], request_start[request + 1]
        uniform_probs[start:end].uniform_(generator=generators[request])
    return uniform_probs


def generate_recovery_noise(
    requests: torch.Tensor,
    num_draft_tokens: Sequence[int],
    vocab_size: int,
    generators: Mapping[int, torch.Generator],
    device: torch.device | str,
    is_greedy: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exp(1) float32 noise over the vocabulary for the given ``[num_rows]`` requests: ``[num_rows, vocab_size]``.

    Unseeded rows are drawn only for the requests asked for (drawing
    ``batch_size x vocab_size`` exponentials costs more than the rest of the
    step on a CPU). Every seeded request that draws this step consumes one row
    from its generator whether or not it is asked for, so its stream does not
    depend on the outcome of the step.
    """
    host_requests = requests.tolist() if generators else []
    return _recovery_noise(
        requests.shape[0],
        host_requests,
        num_draft_tokens,
        vocab_size,
        generators,
        device,
        _host_flags(is_greedy, generators),
    )


def _recovery_noise(
    num_rows: int,
    host_requests: Sequence[int],
    num_draft_tokens: Sequence[int],
    vocab_size: int,
    generators: Mapping[int, torch.Generator],
    device: torch.device | str,
    greedy_flags: Sequence[bool] | None,
) -> torch.Tensor:
    """``generate_recovery_noise`` with the requests on the host (read only when a generator draws)."""
    noise = torch.empty(num_rows, vocab_size, dtype=torch.float32, device=device)
    noise.exponential_()
    seeded = _seeded_requests_that_draw(generators, num_draft_tokens, greedy_flags)
    row_of_request = {request: row for row, request in enumerate(host_requests)} if seeded else {}
    for request in seeded:
        seeded_row = torch.empty(vocab_size, dtype=torch.float32, device=device)
        seeded_row.exponential_(generator=generators[request])
        if request in row_of_request:
            noise[row_of_request[request]] = seeded_row
    return noise


# ---------------------------------------------------------------------------
# The three sampling steps
# ---------------------------------------------------------------------------


def sample_recovered_tokens(
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    recovery_noise: torch.Tensor,
) -> torch.Tensor:
    """A recovered token for every draft position: ``[num_tokens]`` int64.

    The token at a position is drawn from ``max(p - q, 0)`` normalised, with
    ``q`` the draft distribution (``draft_probs`` ``[num_tokens, vocab_size]``)
    or, when ``draft_probs`` is None, the point mass on the draft token.
    Sampling is the exponential race ``argmax(residual / noise)`` with the
    request's ``recovery_noise`` row (``[batch_size, vocab_size]``), which
    picks token ``v`` with probability ``residual[v] / sum(residual)``.
    A draft id < 0 (padding) removes nothing from ``p``.
    """
    num_tokens = draft_token_ids.shape[0]
    request_index, _ = _token_request_and_position(cu_num_draft_tokens, num_tokens)
    return torch.cat(
        [
            _recovered_tokens(
                target_probs[tile].clone(),  # the residual is built in place
                draft_token_ids[tile],
                None if draft_probs is None else draft_probs[tile],
                recovery_noise[request_index[tile]],
            )
            for tile in _row_tiles(num_tokens, target_probs.shape[1], target_probs.device)
        ]
    )


def _recovered_tokens(
    target_prob_rows: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_prob_rows: torch.Tensor | None,
    noise_rows: torch.Tensor,
) -> torch.Tensor:
    """Recovered tokens for ``[num_rows]`` positions; every argument has ``num_rows`` rows.

    ``target_prob_rows`` is overwritten with the residual. Residual first,
    then the division, in the same order as vllm-ascend's loop so that the
    argmax is bit-for-bit the same.
    """
    if target_prob_rows.shape[0] == 0:
        return draft_token_ids.new_empty(0, dtype=torch.long)
    residual = target_prob_rows
    if draft_prob_rows is None:
        draft_column = draft_token_ids.clamp_min(0).long().unsqueeze(1)
        # Zero p at the draft; a padding draft (< 0) removes nothing.
        kept_value = residual.gather(1, draft_column) * (draft_token_ids < 0).unsqueeze(1)
        residual.scatter_(1, draft_column, kept_value)
    else:
        residual.sub_(draft_prob_rows).clamp_min_(0.0)
    return residual.div_(noise_rows).argmax(dim=1)


def _probs_at_drafts(probs: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
    """``probs[i, draft_token_ids[i]]`` as float64 (padding drafts read column 0): ``[num_rows]``."""
    draft_column = draft_token_ids.clamp_min(0).long().unsqueeze(1)
    return probs.gather(1, draft_column).squeeze(1).double()


def _accepted_drafts(
    draft_token_ids: torch.Tensor,
    draft_prob: torch.Tensor | None,
    target_prob: torch.Tensor,
    uniform_probs: torch.Tensor,
) -> torch.Tensor:
    """``[num_tokens]`` bool: ``q(x) > 0`` and ``p(x) / q(x) >= u``, ``q(x) = 1`` for point masses.

    ``target_prob`` and ``draft_prob`` are ``p(x)`` and ``q(x)`` at the drafts,
    float64, like the Python-float loops this replaces. Padding drafts (< 0)
    are never accepted.
    """
    if draft_prob is None:
        # q(x) = 1: p(x) / 1 >= u is p(x) >= u exactly, in two fewer kernels.
        return (draft_token_ids >= 0) & (target_prob >= uniform_probs)
    return (draft_token_ids >= 0) & (draft_prob > 0) & (target_prob / draft_prob >= uniform_probs)


def _num_accepted(accepted: torch.Tensor, cu_num_draft_tokens: torch.Tensor, max_spec_len: int) -> torch.Tensor:
    """Length of each request's leading run of accepted drafts: ``[batch_size]`` int64."""
    batch_size = cu_num_draft_tokens.shape[0]
    request_index, position = _token_request_and_position(cu_num_draft_tokens, accepted.shape[0])
    accepted_grid = _scatter_to_grid(accepted, request_index, position, batch_size, max_spec_len, False)
    # Padding counts as rejected, so the run stops at the draft count.
    return accepted_grid.to(torch.int32).cumprod(dim=1).sum(dim=1)


def _accepted_prefix_to_output(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accepted: torch.Tensor,
    replacement_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    rows_to_write: torch.Tensor | None,
) -> None:
    """Write accepted drafts, then the replacement at the first rejection or the bonus.

    ``accepted``, ``draft_token_ids``, ``replacement_token_ids``: ``[num_tokens]``;
    ``bonus_token_ids``: ``[batch_size]`` or ``[batch_size, 1]``;
    ``rows_to_write``: ``[batch_size]`` bool, None for all rows.
    ``output_token_ids`` (``[batch_size, max_spec_len + 1]``) is updated in place.
    """
    batch_size, width = output_token_ids.shape
    max_spec_len = width - 1
    num_tokens = draft_token_ids.shape[0]
    request_index, position = _token_request_and_position(cu_num_draft_tokens, num_tokens)
    num_drafts = _num_tokens_per_request(cu_num_draft_tokens).long()
    num_accepted = _num_accepted(accepted, cu_num_draft_tokens, max_spec_len)

    draft_grid = _scatter_to_grid(
        draft_token_ids.to(output_token_ids.dtype),
        request_index,
        position,
        batch_size,
        width,
        PLACEHOLDER_TOKEN_ID,
    )
    # Replacement tokens at draft positions; the bonus sits just past the last draft.
    replacement_grid = _scatter_to_grid(
        replacement_token_ids.to(output_token_ids.dtype),
        request_index,
        position,
        batch_size,
        width,
        PLACEHOLDER_TOKEN_ID,
    )
    replacement_grid[torch.arange(batch_size, device=output_token_ids.device), num_drafts] = bonus_token_ids.reshape(
        -1
    ).to(output_token_ids.dtype)

    column = torch.arange(width, device=output_token_ids.device).unsqueeze(0)
    num_accepted = num_accepted.unsqueeze(1)
    sampled = torch.where(
        column < num_accepted,
        draft_grid,
        torch.where(column == num_accepted, replacement_grid, PLACEHOLDER_TOKEN_ID),
    )
    if rows_to_write is not None:
        sampled = torch.where(rows_to_write.unsqueeze(1), sampled, output_token_ids)
    output_token_ids.copy_(sampled)


def rejection_greedy_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None,
) -> None:
    """Greedy verification, in place on ``output_token_ids`` ``[batch_size, max_spec_len + 1]``.

    Drafts equal to the target argmax (``[num_tokens]``) are kept; the first
    mismatch is replaced by the argmax; if none, the bonus token is appended.
    Only rows with ``is_greedy`` (``[batch_size]`` bool) are written; None means all.
    """
    _accepted_prefix_to_output(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        accepted=draft_token_ids == target_argmax,
        replacement_token_ids=target_argmax,
        bonus_token_ids=bonus_token_ids,
        rows_to_write=is_greedy,
    )


def rejection_random_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor | None,
) -> None:
    """Stochastic verification, in place on ``output_token_ids`` ``[batch_size, max_spec_len + 1]``.

    Draft ``x`` at a position is accepted when ``q(x) > 0`` and
    ``p(x) / q(x) >= u`` (``q(x) = 1`` without ``draft_probs``). The first
    rejected position takes its ``recovered_token_ids`` entry; if none is
    rejected the bonus token is appended. Only rows where ``is_greedy`` is
    False are written (None: all rows).
    Shapes: ``draft_token_ids``, ``recovered_token_ids``, ``uniform_probs``:
    ``[num_tokens]``; ``draft_probs``, ``target_probs``: ``[num_tokens, vocab_size]``;
    ``bonus_token_ids``: ``[batch_size]`` or ``[batch_size, 1]``.
    """
    _accepted_prefix_to_output(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        accepted=_accepted_drafts(
            draft_token_ids,
            None if draft_probs is None else _probs_at_drafts(draft_probs, draft_token_ids),
            _probs_at_drafts(target_probs, draft_token_ids),
            uniform_probs,
        ),
        replacement_token_ids=recovered_token_ids,
        bonus_token_ids=bonus_token_ids,
        rows_to_write=None if is_greedy is None else ~is_greedy,
    )


# ---------------------------------------------------------------------------
# Top level
# ---------------------------------------------------------------------------


def rejection_sample(
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
    """Verify a batch of drafts against the target model; returns ``[batch_size, max_spec_len + 1]`` int32.

    Args:
        draft_token_ids: ``[num_tokens]`` drafts, request after request.
        num_draft_tokens: ``[batch_size]`` drafts per request (Python ints).
        max_spec_len: output width minus one; ``>= max(num_draft_tokens)``.
        cu_num_draft_tokens: ``[batch_size]`` cumulative ``num_draft_tokens``.
        draft_probs: ``[num_tokens, vocab_size]`` draft distributions, or None
            for point-mass drafts.
        target_logits: ``[num_tokens, vocab_size]`` target logits at the draft
            positions (not modified).
        bonus_token_ids: ``[batch_size, 1]`` (or ``[batch_size]``) token sampled
            by the caller from the target after the last draft.
        temperature: ``[batch_size]``; ``<= GREEDY_TEMPERATURE`` means greedy.
        top_k, top_p: ``[batch_size]`` or None, applied to the target logits
            after the temperature, before the softmax.
        generators: request index -> generator for seeded requests.
        uniform_probs: optional pre-drawn ``[num_tokens]`` float64 uniforms.
        recovery_noise: optional pre-drawn ``[batch_size, vocab_size]`` Exp(1)
            noise. Pre-drawn numbers make two implementations comparable token
            for token; when given, ``generators`` is not consulted for them.
    """
    batch_size = len(num_draft_tokens)
    num_tokens, vocab_size = target_logits.shape
    assert draft_token_ids.shape == (num_tokens,)
    assert cu_num_draft_tokens.shape == (batch_size,)
    assert draft_probs is None or draft_probs.shape == (num_tokens, vocab_size)
    assert max(num_draft_tokens, default=0) <= max_spec_len
    device = target_logits.device
    generators = generators or {}
    if loop_is_cheaper(batch_size, device):
        return rejection_sample_reference(
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            temperature,
            top_k,
            top_p,
            generators,
            uniform_probs,
            recovery_noise,
        )
    bonus_token_ids = bonus_token_ids.reshape(-1)
    if num_tokens == 0:
        output_token_ids = torch.full(
            (batch_size, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device
        )
        output_token_ids[:, 0] = bonus_token_ids
        return output_token_ids

    # The step's one read of a device value: the temperatures pick the paths.
    host_temperature = temperature.tolist()
    greedy_flags = [value <= GREEDY_TEMPERATURE for value in host_temperature]
    any_greedy, all_greedy = any(greedy_flags), all(greedy_flags)
    layout = _BatchLayout.build(num_draft_tokens, device)
    is_greedy = temperature <= GREEDY_TEMPERATURE

    if any_greedy:
        # Temperature, top-k and top-p all keep the argmax, so greedy reads the raw logits.
        target_argmax = target_logits.argmax(dim=1)
        greedy_accepted = draft_token_ids == target_argmax
        if all_greedy:
            num_accepted = _num_accepted_in_layout(greedy_accepted, layout)
            first_rejection = _first_rejection_tokens(layout, num_accepted, num_tokens)
            return _output_grid(
                draft_token_ids, layout, num_accepted, target_argmax[first_rejection], bonus_token_ids, max_spec_len
            )

    # The target distribution is built tile by tile and never held whole: the
    # accept test needs only p(x), the recovery only the first rejected rows.
    scales = any(not greedy and value != 1.0 for greedy, value in zip(greedy_flags, host_temperature))
    constraints = _token_constraints(layout, temperature, top_k, top_p)

    def target_probs_at(rows: slice | torch.Tensor) -> torch.Tensor:
        logits = _constrain_logits(target_logits[rows], *_take_constraints(constraints, rows), scales=scales)
        return logits.softmax(dim=-1)

    target_prob = _cat(
        [
            _probs_at_drafts(target_probs_at(tile), draft_token_ids[tile])
            for tile in _row_tiles(num_tokens, vocab_size, device)
        ]
    )
    draft_prob = None if draft_probs is None else _probs_at_drafts(draft_probs, draft_token_ids)
    if uniform_probs is None:
        uniform_probs = _uniform_probs(num_draft_tokens, generators, device, greedy_flags)
    accepted = _accepted_drafts(draft_token_ids, draft_prob, target_prob, uniform_probs)
    if any_greedy:
        accepted = torch.where(is_greedy[layout.token_request], greedy_accepted, accepted)
    num_accepted = _num_accepted_in_layout(accepted, layout)
    first_rejection = _first_rejection_tokens(layout, num_accepted, num_tokens)

    # Only the recovered token at a request's first rejection is emitted. An accelerator
    # computes it for every request (no host read of which ones rejected); a CPU only for
    # the requests that need it, since a vocabulary row of noise costs more there.
    if recovers_every_request(device):
        recovery_requests = None
        host_requests: Sequence[int] = range(batch_size)
    else:
        recovery_requests = torch.nonzero(~is_greedy & (num_accepted < layout.num_drafts)).squeeze(1)
        host_requests = recovery_requests.tolist()
    recovery_tokens = first_rejection if recovery_requests is None else first_rejection[recovery_requests]
    if recovery_noise is None:
        noise_rows = _recovery_noise(
            len(host_requests), host_requests, num_draft_tokens, vocab_size, generators, device, greedy_flags
        )
    else:
        noise_rows = recovery_noise if recovery_requests is None else recovery_noise[recovery_requests]
    recovered = _cat(
        [
            _recovered_tokens(
                target_probs_at(recovery_tokens[rows]),
                draft_token_ids[recovery_tokens[rows]],
                None if draft_probs is None else draft_probs[recovery_tokens[rows]],
                noise_rows[rows],
            )
            for rows in _row_tiles(len(host_requests), vocab_size, device)
        ]
    )
    if recovery_requests is not None:
        recovered = torch.full((batch_size,), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device).index_put_(
            (recovery_requests,), recovered
        )
    if any_greedy:
        recovered = torch.where(is_greedy, target_argmax[first_rejection], recovered)
    return _output_grid(draft_token_ids, layout, num_accepted, recovered, bonus_token_ids, max_spec_len)


# On an accelerator every call pays per kernel launch and per host read. The H200 measured the
# vectorised call (134 kernels, 9 reads) at 1.4 ms and the loop at batch 1 (19 kernels, 9 reads) at
# 0.3 ms: about 10 us a kernel, 13 us a read. Now 43 kernels and 1 read (~0.45 ms by that model), the
# loop stays cheaper for a single request and dearer from two (38 kernels, 18 reads). Both are exact and
# consume a seeded request's generator alike, so the dispatch changes no seeded or pre-drawn token.
LOOP_MAX_BATCH_ON_ACCELERATOR = 1


def loop_is_cheaper(batch_size: int, device: torch.device) -> bool:
    """Whether ``rejection_sample`` hands this batch to the plain loop (accelerators, tiny batches)."""
    return device.type != "cpu" and batch_size <= LOOP_MAX_BATCH_ON_ACCELERATOR


def recovers_every_request(device: torch.device) -> bool:
    """Whether the sampler computes a recovered token for every request (True) or only the rejecting ones."""
    return device.type != "cpu"


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` without a copy for the single tile of an accelerator."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


@dataclass(frozen=True)
class _BatchLayout:
    """Where each request's drafts sit, built on the host from the Python draft counts.

    ``token_request``, ``token_position``: ``[num_tokens]`` int64, request and position of every draft;
    ``request_start``, ``num_drafts``: ``[batch_size]`` int64.
    """

    token_request: torch.Tensor
    token_position: torch.Tensor
    request_start: torch.Tensor
    num_drafts: torch.Tensor
    max_spec_len_hint: int

    @classmethod
    def build(cls, num_draft_tokens: Sequence[int], device: torch.device) -> _BatchLayout:
        counts = np.asarray(num_draft_tokens, dtype=np.int64)
        starts = np.cumsum(counts) - counts
        token_request = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
        token_position = np.arange(token_request.shape[0], dtype=np.int64) - starts[token_request]
        # One host-to-device copy for all four; from pinned memory it does not wait for the device's queue.
        packed = torch.from_numpy(np.concatenate([token_request, token_position, starts, counts]))
        if device.type == "cuda":
            packed = packed.pin_memory().to(device, non_blocking=True)
        else:
            packed = packed.to(device)
        num_tokens, batch_size = token_request.shape[0], counts.shape[0]
        return cls(*packed.split([num_tokens, num_tokens, batch_size, batch_size]), int(counts.max(initial=0)))


def _token_constraints(
    layout: _BatchLayout, temperature: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> TokenConstraints:
    """Per-token temperature (greedy -> 1), top-k and top-p, gathered by the layout: ``[num_tokens]`` each."""
    temperature = temperature.to(torch.float32)
    safe_temperature = torch.where(temperature <= GREEDY_TEMPERATURE, 1.0, temperature)
    return (
        safe_temperature[layout.token_request],
        None if top_k is None else top_k[layout.token_request],
        None if top_p is None else top_p[layout.token_request],
    )


def _num_accepted_in_layout(accepted: torch.Tensor, layout: _BatchLayout) -> torch.Tensor:
    """Length of each request's leading run of accepted drafts: ``[batch_size]`` int64.

    The smallest rejected position per request, starting from the draft count.
    """
    rejected_position = torch.where(accepted, layout.max_spec_len_hint, layout.token_position)
    return layout.num_drafts.scatter_reduce(0, layout.token_request, rejected_position, "amin")


def _first_rejection_tokens(layout: _BatchLayout, num_accepted: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """``[batch_size]`` token index of each request's first rejection (clamped in range; meaningless
    where every draft was accepted)."""
    return (layout.request_start + num_accepted).clamp_(max=num_tokens - 1)


def _output_grid(
    draft_token_ids: torch.Tensor,
    layout: _BatchLayout,
    num_accepted: torch.Tensor,
    replacement_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    max_spec_len: int,
) -> torch.Tensor:
    """``[batch_size, max_spec_len + 1]`` int32: accepted drafts, then the replacement at the first rejection
    (``replacement_token_ids`` ``[batch_size]``) or the bonus, then padding."""
    num_tokens = draft_token_ids.shape[0]
    column = torch.arange(max_spec_len + 1, device=draft_token_ids.device)
    draft_grid = draft_token_ids[(layout.request_start.unsqueeze(1) + column).clamp_(max=num_tokens - 1)]
    next_token = torch.where(num_accepted < layout.num_drafts, replacement_token_ids, bonus_token_ids)
    num_accepted = num_accepted.unsqueeze(1)
    sampled = torch.where(
        column < num_accepted,
        draft_grid.long(),
        torch.where(column == num_accepted, next_token.long().unsqueeze(1), PLACEHOLDER_TOKEN_ID),
    )
    return sampled.to(torch.int32)
