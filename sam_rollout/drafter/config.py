"""Drafting settings: one validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .layout import MAX_LONG_MATCH

LENGTH_POLICIES = ("fixed", "scaled", "confidence", "match")
MAX_MATCH_SCALE = 64.0
CONTINUATIONS = ("first", "frequent", "adaptive")
COUNTED_CONTINUATIONS = ("frequent", "adaptive")  # those that keep occurrence counts


@dataclass(frozen=True)
class DraftConfig:
    """How the SAM drafter proposes.

    k: most tokens drafted per request and step (the cap; an engine's num_speculative_tokens).
    min_match: no draft unless the matched suffix has at least this many tokens.
    length_policy: "fixed" drafts k tokens; "scaled" drafts one token per matched token beyond
        min_match - 1, capped at k (a 1-token match is mostly wasted verification); "confidence"
        (frequent continuation only) drafts while the estimated probability that the whole draft is
        accepted stays >= min_token_prob; "match" drafts base_k tokens, or floor(match_scale x match
        length) where that is more, capped at k, and a draft from occurrence counts (frequent,
        adaptive) takes its tokens beyond base_k only while the estimated probability of the whole
        draft stays >= min_token_prob. With k <= base_k, "match" drafts exactly what "fixed" does.
    base_k: "match": the tokens any match drafts (at most k).
    match_scale: "match": draft tokens per matched token (0 to 64): a long match (a revisit following
        an earlier response, a sibling copying a derivation) drafts long. The defaults ("match", base_k
        3, match_scale 1.0) were chosen on half of the replayed prompts (benchmarks/draft_length.py);
        at the default k = 3 they draft what "fixed" does.
    continuation: which continuation of the matched suffix to draft. "first" follows its first
        occurrence. "frequent" does so only for matches longer than `long_match` tokens; shorter
        ones are scored by the expected number of accepted tokens under occurrence counts (pooled
        over all sources, and over the group automaton alone), and the best one's most frequent
        continuation is drafted. "adaptive" computes both for matches of at most `long_match` tokens
        and, per group, sends the first occurrence while it has been right clearly more often than
        the frequent one where their first tokens differed (scored on the tokens emitted next).
    long_match: frequent, adaptive: the longest match that is scored by counts (1 to 16).
    min_token_prob: the "confidence" threshold.
    count_prior: frequent, adaptive: pseudo-occurrences added to every context's count, so that a
        context seen once does not look certain. A draft's first token is scored on the context's
        earlier occurrences only (the request's own end has no continuation yet). The default, 0,
        trusts a continuation seen once: long reasoning text repeats itself (benchmarks/long_replay.py).
    recency_weight: frequent, adaptive: a context's drafted continuation is its most frequent one,
        except that a continuation just seen takes its place once its count times this weight reaches
        that one's (1.0: ties go to the most recent; higher values favour recent text; 1.0 to 100).
    group_aware: requests started with the same group (GRPO siblings of one prompt) draft from each
        other's text as well as their own.
    history_tokens: keep up to this many tokens of recently finished responses (across prompts) as a
        third draft source; 0 turns history off. The oldest half is dropped when it is full.
    prompt_store: keep finished responses per prompt (`sam_rollout.drafter.prompt_store.PromptStore`) and put them
        into the group automaton when the prompt is next started (RL revisits prompts every epoch).
    prompt_store_bytes: the store's budget; past it, the least recently updated prompts go. The
        default holds a whole DAPO-Math-17k epoch at the per-prompt cap (17,917 x 64 KiB = 1.1 GiB).
    prompt_store_tokens: most tokens kept per prompt (the newest responses).
    """

    k: int = 3
    min_match: int = 1
    length_policy: str = "match"
    base_k: int = 3
    match_scale: float = 1.0
    continuation: str = "adaptive"
    min_token_prob: float = 0.1
    count_prior: float = 0.0
    recency_weight: float = 1.5
    long_match: int = 16
    group_aware: bool = True
    history_tokens: int = 0
    prompt_store: bool = False
    prompt_store_bytes: int = 2 << 30
    prompt_store_tokens: int = 16384

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kind = {"bool": bool, "int": int, "float": float}.get(str(f.type), str)
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"DraftConfig.{f.name} must be an integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"DraftConfig.{f.name} must be a number, got {value!r}")
            if kind is bool and not isinstance(value, bool):
                raise ValueError(f"DraftConfig.{f.name} must be true or false, got {value!r}")
        if self.k < 0:
            raise ValueError(f"DraftConfig.k must be >= 0, got {self.k}")
        if self.min_match < 1:
            raise ValueError(f"DraftConfig.min_match must be >= 1, got {self.min_match}")
        if self.length_policy not in LENGTH_POLICIES:
            raise ValueError(f"DraftConfig.length_policy must be one of {LENGTH_POLICIES}, got {self.length_policy!r}")
        if self.continuation not in CONTINUATIONS:
            raise ValueError(f"DraftConfig.continuation must be one of {CONTINUATIONS}, got {self.continuation!r}")
        if self.length_policy == "confidence" and self.continuation != "frequent":
            raise ValueError(
                "DraftConfig.length_policy 'confidence' needs continuation 'frequent' (it reads occurrence counts)"
            )
        if self.base_k < 1:
            raise ValueError(f"DraftConfig.base_k must be >= 1, got {self.base_k}")
        if not 0.0 <= self.match_scale <= MAX_MATCH_SCALE:
            raise ValueError(f"DraftConfig.match_scale must be in [0, {MAX_MATCH_SCALE:g}], got {self.match_scale}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"DraftConfig.min_token_prob must be in [0, 1], got {self.min_token_prob}")
        if not 1 <= self.long_match <= MAX_LONG_MATCH:
            raise ValueError(f"DraftConfig.long_match must be in [1, {MAX_LONG_MATCH}], got {self.long_match}")
        if not 1.0 <= self.recency_weight <= 100.0:
            raise ValueError(f"DraftConfig.recency_weight must be in [1, 100], got {self.recency_weight}")
        if not self.count_prior >= 0.0:
            raise ValueError(f"DraftConfig.count_prior must be >= 0, got {self.count_prior}")
        if self.history_tokens < 0:
            raise ValueError(f"DraftConfig.history_tokens must be >= 0, got {self.history_tokens}")
        if self.prompt_store_bytes < 1:
            raise ValueError(f"DraftConfig.prompt_store_bytes must be >= 1, got {self.prompt_store_bytes}")
        if self.prompt_store_tokens < 1:
            raise ValueError(f"DraftConfig.prompt_store_tokens must be >= 1, got {self.prompt_store_tokens}")
