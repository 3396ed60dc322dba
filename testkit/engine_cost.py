"""Step cost of a real vLLM engine with q tokens per request: a proposer that always drafts k tokens.

``FixedDraftProposer`` (``speculative_config={"method": "custom_class", "model":
"testkit.engine_cost.FixedDraftProposer", "num_speculative_tokens": k}``) drafts k copies of one
rare token for every decoding row, so every decode step verifies exactly q = k + 1 tokens per
request and (almost) always emits one: the engine's decode step at q, through the engine's own
scheduler, attention metadata, sampler and rejection sampler. Accepted drafts, if any, are counted
by vLLM's spec-decode counters and taken out of the step count.
"""

from __future__ import annotations

DRAFT_TOKEN = 1  # a special token of SmolLM2's vocabulary: greedy decoding practically never emits it


class FixedDraftProposer:
    def __init__(self, vllm_config):
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len

    def load_model(self, *args, **kwargs) -> None:  # the CPU runner calls it unconditionally
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs):
        out = []
        for i, sampled in enumerate(sampled_token_ids):
            room = self.max_model_len - int(num_tokens_no_spec[i])
            out.append([DRAFT_TOKEN] * max(0, min(self.k, room)) if len(sampled) else [])
        return out
