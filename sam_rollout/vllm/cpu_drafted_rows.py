"""Patch ``cpu_drafted_rows``: draw the rejection sampler's recovery noise only for requests that have
drafts (CPU platforms; docs/patches.md).

vLLM's ``sample_recovered_tokens`` fills exponential noise of shape [batch, vocab] in every step of an
engine with speculation configured, drafts or not, and reads only the rows of requests with drafts. On a
CPU that draw is real compute (measurements in docs/vllm-hooks.md), paid even where nothing is drafted.

``install()`` wraps the function: it calls vLLM's own with the batch compacted to the requests that have
drafts (their draft tokens are already contiguous), or returns at once when none has. Per-request
generators are consumed exactly as before (vLLM draws from them only for requests with drafts); the
global generator draws fewer numbers, which changes no distribution.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

from sam_rollout.patches import replace

NAME = "cpu_drafted_rows"


def drafted_rows_only(original):
    """vLLM's ``sample_recovered_tokens`` restricted to the requests that have drafts."""

    @functools.wraps(original)
    def sample_recovered_tokens(
        max_spec_len,
        num_draft_tokens,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        sampling_metadata,
        device,
        *args,
        **kwargs,
    ):
        rows = [i for i, n in enumerate(num_draft_tokens) if n > 0]
        if len(rows) == len(num_draft_tokens):
            compact_counts, compact_cu, compact_meta = num_draft_tokens, cu_num_draft_tokens, sampling_metadata
        elif not rows:
            return draft_token_ids.new_empty(draft_token_ids.shape)
        else:
            new_index = {old: new for new, old in enumerate(rows)}
            compact_counts = [num_draft_tokens[i] for i in rows]
            # rows without drafts add nothing to the cumulative counts: a drafted row's end stays its end
            compact_cu = cu_num_draft_tokens[rows]
            generators = {new_index[i]: g for i, g in sampling_metadata.generators.items() if i in new_index}
            compact_meta = _with_generators(sampling_metadata, generators)
        return original(
            max_spec_len,
            compact_counts,
            compact_cu,
            draft_token_ids,
            draft_probs,
            target_probs,
            compact_meta,
            device,
            *args,
            **kwargs,
        )

    return sample_recovered_tokens


def _with_generators(sampling_metadata, generators: dict):
    if dataclasses.is_dataclass(sampling_metadata):
        return dataclasses.replace(sampling_metadata, generators=generators)
    meta = copy.copy(sampling_metadata)  # a namespace standing in for vLLM's dataclass
    meta.generators = generators
    return meta


def install() -> bool:
    """Wrap vLLM's ``sample_recovered_tokens`` (looked up at call time) in this process; False if it
    already was."""
    from vllm.v1.sample import rejection_sampler as rs

    return replace(rs, "sample_recovered_tokens", drafted_rows_only, NAME)
