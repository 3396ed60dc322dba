"""Patch ``undrafted_steps``: a step in which no request has drafts samples as an engine without speculation
does (docs/patches.md). vLLM samples every step of a speculative engine through
``RejectionSampler.forward``, whose work in a step without drafts returns the very token the plain
``Sampler`` draws (what it costs: docs/vllm-hooks.md, "The online switch").

``install()`` wraps ``RejectionSampler.forward``: when no request in the step has drafts, it calls the
rejection sampler's own ``Sampler`` on the logits, as the bonus-token call does
(``predict_bonus_token=True``, so penalties and the thinking budget see the same layout), but with the
step's own logprob settings, so logprobs come out as an engine without speculation returns them. Steps
with drafts are untouched. Per-request generators are drawn exactly as before; the global generator skips
vLLM's recovery noise for the step (already skipped on CPU platforms by
``sam_rollout.vllm.cpu_drafted_rows``), which changes no distribution.
"""

from __future__ import annotations

import functools

from sam_rollout.patches import replace

NAME = "undrafted_steps"


def plain_sampling_without_drafts(forward):
    """``RejectionSampler.forward`` that hands a step without drafts to the plain sampler."""

    @functools.wraps(forward)
    def forward_or_plain(self, metadata, draft_probs, logits, sampling_metadata, *args, **kwargs):
        if metadata.max_spec_len > 0 or args or kwargs:
            return forward(self, metadata, draft_probs, logits, sampling_metadata, *args, **kwargs)
        # no drafts: one logits row per request, in request order (the bonus rows are all the rows)
        if logits.shape[0] != len(metadata.num_draft_tokens):
            logits = logits[metadata.bonus_logits_indices]
        return self.sampler(logits=logits, sampling_metadata=sampling_metadata, predict_bonus_token=True)

    return forward_or_plain


def install() -> bool:
    """Wrap ``RejectionSampler.forward`` in this process; False if it already was."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    return replace(RejectionSampler, "forward", plain_sampling_without_drafts, NAME)
