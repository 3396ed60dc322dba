"""The drafters a replay compares, behind one small interface.

A replay calls, per group of siblings: `start` for each, then per step `propose` for all active ones
(from the state after the previous step), then `extend` for all, and `finish` as each one ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sam_rollout.drafter import BatchDrafter, DraftConfig


class ReplayDrafter(Protocol):
    name: str

    def start(self, req_id: str, prompt: np.ndarray, group: str) -> None: ...

    def propose(self, req_ids: list[str], contexts: list[np.ndarray], k: int) -> list[np.ndarray]: ...

    def extend(self, req_ids: list[str], new_tokens: list[np.ndarray]) -> None: ...

    def finish(self, req_id: str) -> None: ...


class SamDrafter:
    """Our drafter, through its public batch API. ``max_draft``: a draft-length cap of its own (the
    replay's k otherwise), for length policies that may reach further than the fixed k."""

    def __init__(self, name: str, config: DraftConfig, max_draft: int | None = None) -> None:
        self.name = name
        self.drafter = BatchDrafter(config)
        self.max_draft = max_draft

    def start(self, req_id, prompt, group):
        self.drafter.start(req_id, prompt, group=group)

    def propose(self, req_ids, contexts, k):
        proposal = self.drafter.propose(req_ids, k)
        return [proposal.tokens[i, : proposal.lengths[i]] for i in range(len(req_ids))]

    def extend(self, req_ids, new_tokens):
        self.drafter.extend(req_ids, np.concatenate(new_tokens), [len(t) for t in new_tokens])

    def finish(self, req_id):
        self.drafter.finish(req_id)


class VllmNgramDrafter:
    """vLLM's own n-gram proposer core (KMP over the request's context), as its NgramProposer calls it."""

    def __init__(self, min_n: int, max_n: int) -> None:
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        self._find = _find_longest_matched_ngram_and_propose_tokens
        self.min_n, self.max_n = min_n, max_n
        self.name = f"vLLM n-gram ({min_n},{max_n})"

    def start(self, req_id, prompt, group):
        pass

    def propose(self, req_ids, contexts, k):
        return [self._find(ctx, self.min_n, self.max_n, 1 << 30, k) for ctx in contexts]

    def extend(self, req_ids, new_tokens):
        pass

    def finish(self, req_id):
        pass


class ArcticSuffixDrafter:
    """Arctic Inference suffix decoding with vLLM's defaults; its cache lives across groups, as it
    lives across RL steps in an engine."""

    name = "Arctic suffix decoding"

    def __init__(
        self,
        max_tree_depth: int = 24,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = 10000,
    ) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
        self.depth, self.factor, self.min_prob = max_tree_depth, max_spec_factor, min_token_prob

    def start(self, req_id, prompt, group):
        self.cache.start_request(req_id, prompt)

    def propose(self, req_ids, contexts, k):
        out = []
        for req_id, ctx in zip(req_ids, contexts):
            draft = self.cache.speculate(
                req_id, ctx[-self.depth :], max_spec_tokens=k, max_spec_factor=self.factor, min_token_prob=self.min_prob
            )
            out.append(np.asarray(draft.token_ids, dtype=np.int32))
        return out

    def extend(self, req_ids, new_tokens):
        for req_id, tokens in zip(req_ids, new_tokens):
            self.cache.add_active_response(req_id, tokens.tolist())

    def finish(self, req_id):
        self.cache.stop_request(req_id)


class VllmSuffixDrafter:
    """vLLM's own suffix-decoding proposer (``SuffixDecodingProposer``, Arctic's cache underneath) with vLLM's
    defaults, driven through its ``propose`` over a stand-in for the input batch it reads."""

    name = "vLLM suffix method"

    def __init__(self, k: int, max_model_len: int = 1 << 20) -> None:
        from types import SimpleNamespace

        from vllm.config import SpeculativeConfig
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        fields = SpeculativeConfig.__dataclass_fields__
        suffix = {name: f.default for name, f in fields.items() if name.startswith("suffix_decoding")}
        spec = SimpleNamespace(num_speculative_tokens=k, **suffix)
        config = SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=max_model_len))
        self.proposer = SuffixDecodingProposer(config)
        self.k = k
        self._prompt_len: dict[str, int] = {}
        self._new: dict[str, list[int]] = {}

    def start(self, req_id, prompt, group):
        self._prompt_len[req_id] = len(prompt)
        self._new[req_id] = []

    def propose(self, req_ids, contexts, k):
        if k != self.k:
            raise ValueError(f"vLLM's proposer was built for k={self.k}, asked for {k}")
        width = max(len(c) for c in contexts)
        rows = np.zeros((len(req_ids), width), dtype=np.int32)
        for i, c in enumerate(contexts):
            rows[i, : len(c)] = c
        batch = SimpleBatch(
            req_ids=list(req_ids),
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            num_tokens_no_spec=np.array([len(c) for c in contexts]),
            num_prompt_tokens=np.array([self._prompt_len[r] for r in req_ids]),
            token_ids_cpu=rows,
        )
        sampled = [self._new[r] for r in req_ids]
        for r in req_ids:
            self._new[r] = []
        drafts = self.proposer.propose(k, batch, sampled)
        return [np.asarray(d, dtype=np.int32) for d in drafts]

    def extend(self, req_ids, new_tokens):
        for req_id, tokens in zip(req_ids, new_tokens):
            self._new[req_id].extend(int(t) for t in tokens)

    def finish(self, req_id):  # the proposer stops a request once a batch no longer holds it
        del self._prompt_len[req_id], self._new[req_id]


@dataclass
class SimpleBatch:
    """The fields of vLLM's InputBatch that its suffix proposer reads."""

    req_ids: list
    req_id_to_index: dict
    num_tokens_no_spec: np.ndarray
    num_prompt_tokens: np.ndarray
    token_ids_cpu: np.ndarray


def vllm_available() -> bool:
    try:
        import vllm.v1.spec_decode.ngram_proposer  # noqa: F401
    except Exception:
        return False
    return True


def arctic_available() -> bool:
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except Exception:
        return False
    return True
