"""Drafting settings: one validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass, fields

LENGTH_POLICIES = ("fixed", "scaled")


@dataclass(frozen=True)
class DraftConfig:
    """How the SAM drafter proposes.

    k: most tokens drafted per request and step.
    min_match: no draft unless the matched suffix has at least this many tokens.
    length_policy: "fixed" drafts k tokens; "scaled" drafts one token per matched token beyond
        min_match - 1, capped at k (a 1-token match is mostly wasted verification).
    group_aware: requests started with the same group (GRPO siblings of one prompt) draft from each
        other's text as well as their own.
    history_tokens: keep up to this many tokens of recently finished responses (across prompts) as a
        third draft source; 0 turns history off. The oldest half is dropped when it is full.
    """

    k: int = 3
    min_match: int = 1
    length_policy: str = "fixed"
    group_aware: bool = True
    history_tokens: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            expected = bool if f.type in ("bool", bool) else (int if f.type in ("int", int) else str)
            if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"DraftConfig.{f.name} must be an integer, got {value!r}")
            if expected is bool and not isinstance(value, bool):
                raise ValueError(f"DraftConfig.{f.name} must be true or false, got {value!r}")
        if self.k < 0:
            raise ValueError(f"DraftConfig.k must be >= 0, got {self.k}")
        if self.min_match < 1:
            raise ValueError(f"DraftConfig.min_match must be >= 1, got {self.min_match}")
        if self.length_policy not in LENGTH_POLICIES:
            raise ValueError(f"DraftConfig.length_policy must be one of {LENGTH_POLICIES}, got {self.length_policy!r}")
        if self.history_tokens < 0:
            raise ValueError(f"DraftConfig.history_tokens must be >= 0, got {self.history_tokens}")
