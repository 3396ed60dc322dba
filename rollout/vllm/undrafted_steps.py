"""A step in which no request has drafts samples as an engine without speculation does.

With speculation configured, vLLM routes every step through ``RejectionSampler.forward``, drafts or
not. In a step without drafts that call gathers the logits into a copy, converts them to float32 once
more for logprobs it then discards, and runs the rejection kernels on empty inputs, before it returns
the bonus token: the very token the plain ``Sampler`` would have drawn. On a CPU that is 1-3% of a
step (``scripts/bench_sampler_step.py``; docs/vllm-hooks.md), paid in every step the switch keeps
speculation off.

``install()`` (from the plugin, in every vLLM process) wraps ``RejectionSampler.forward``: when no
request in the step has drafts, it calls the rejection sampler's own ``Sampler`` on the logits, as the
bonus-token call does (``predict_bonus_token=True``, so penalties and the thinking budget see the same
layout), but with the step's own logprob settings, so logprobs come out as an engine without
speculation returns them. Steps with drafts are untouched. Per-request generators are drawn exactly as
before; the global generator skips vLLM's recovery noise for the step (already skipped on CPU platforms
by ``rollout.vllm.cpu_drafted_rows``), which changes no distribution. ``SAM_UNDRAFTED_STEPS=0`` leaves
vLLM as released.
"""

from __future__ import annotations

import functools
import os

_MARK = "__sam_undrafted_steps__"
DISABLE_ENV = "SAM_UNDRAFTED_STEPS"


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

    setattr(forward_or_plain, _MARK, True)
    forward_or_plain.original = forward
    return forward_or_plain


def install() -> bool:
    """Wrap ``RejectionSampler.forward`` in this process; idempotent. False if disabled by env."""
    if os.environ.get(DISABLE_ENV) == "0":
        return False
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    if not getattr(RejectionSampler.forward, _MARK, False):
        RejectionSampler.forward = plain_sampling_without_drafts(RejectionSampler.forward)
    return True
