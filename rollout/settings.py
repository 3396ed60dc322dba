"""Engine-side SAM settings: ``additional_config["sam_spec"]``, validated in one place.

k is not a setting here: it is ``speculative_config.num_speculative_tokens``. Every other setting
lives in ``additional_config["sam_spec"]`` because vLLM rejects extra keys in ``speculative_config``.
A bad value raises ValueError naming the setting, so the engine fails at start with that message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from rollout.engine_kwargs import SETTINGS_KEY
from sam import DraftConfig
from sam.switch import validate_schedule

AUTO = "auto"  # schedule: the online switch (sam.auto_switch)
WHERE = f"additional_config.{SETTINGS_KEY}"
_DRAFT_FIELDS = (
    "min_match",
    "length_policy",
    "continuation",
    "group_aware",
    "history_tokens",
    "prompt_store",
    "prompt_store_bytes",
)


@dataclass(frozen=True)
class SamSettings:
    """threshold: speculate only in steps whose number of scheduled requests (prefills included) is
        <= threshold; ``None`` = always. Drafter state is kept current either way.
    schedule: ``[[max_batch, k], ...]`` (strictly increasing max_batch, 0 <= k <= k of
        speculative_config): a step scheduling n requests drafts k tokens from the first pair with
        n <= max_batch, none above the last pair (``sam.switch``); or ``"auto"``: the online switch
        learns this engine's step cost and the drafts' acceptance and chooses k per step
        (``sam.auto_switch``). Set instead of ``threshold``.
    min_match, length_policy, continuation, group_aware, history_tokens, prompt_store,
        prompt_store_bytes: passed to ``sam.DraftConfig`` (the prompt store lives in the engine's
        drafter, so it carries a prompt's responses from one RL step to its next visit).
    log_interval_s: log the proposer's own metrics every this many seconds (0 = never).
    """

    k: int = 3
    threshold: int | None = 8
    min_match: int = 1
    length_policy: str = "fixed"
    group_aware: bool = True
    continuation: str = DraftConfig.continuation
    history_tokens: int = 0
    prompt_store: bool = False
    prompt_store_bytes: int = DraftConfig.prompt_store_bytes
    log_interval_s: float = 0.0
    schedule: tuple | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"speculative_config.num_speculative_tokens must be an integer >= 1, got {self.k!r}")
        t = self.threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise ValueError(f"{WHERE}.threshold must be an integer >= 0 or null, got {t!r}")
        if isinstance(self.schedule, str):
            if self.schedule != AUTO:
                raise ValueError(
                    f'{WHERE}.schedule must be "{AUTO}" or a list of [max_batch, k] pairs, got {self.schedule!r}'
                )
        elif self.schedule is not None:  # normalise to a tuple of int pairs (hashable, frozen)
            object.__setattr__(self, "schedule", validate_schedule(self.schedule, self.k, f"{WHERE}.schedule"))
        li = self.log_interval_s
        if isinstance(li, bool) or not isinstance(li, (int, float)) or li < 0:
            raise ValueError(f"{WHERE}.log_interval_s must be a number >= 0, got {li!r}")
        try:
            self.draft_config()
        except ValueError as e:  # DraftConfig names the field; say where it came from
            raise ValueError(f"{WHERE}: {e}") from None

    def draft_config(self) -> DraftConfig:
        return DraftConfig(k=self.k, **{f: getattr(self, f) for f in _DRAFT_FIELDS})

    @classmethod
    def from_mapping(cls, k: int, raw: Mapping[str, Any] | None) -> SamSettings:
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ValueError(f"{WHERE} must be a mapping, got {type(raw).__name__}")
        raw = dict(raw)
        if "k" in raw:
            raise ValueError(
                f"{WHERE}.k is not a setting: k is speculative_config.num_speculative_tokens "
                f"(got {WHERE}.k={raw['k']!r})"
            )
        known = {f.name for f in fields(cls)} - {"k"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{WHERE}: unknown setting(s) {unknown}; known: {sorted(known)}")
        if raw.get("schedule") is not None and raw.get("threshold") is not None:
            raise ValueError(
                f"{WHERE}: set either threshold or schedule, not both (got threshold={raw['threshold']!r} "
                f"and schedule={raw['schedule']!r}); a threshold t is the schedule [[t, k]]"
            )
        return cls(k=k, **raw)

    @classmethod
    def from_vllm_config(cls, vllm_config) -> SamSettings:
        """From a vLLM config object (duck-typed: ``speculative_config`` and ``additional_config``)."""
        spec = vllm_config.speculative_config
        extra = getattr(vllm_config, "additional_config", None) or {}
        raw = extra.get(SETTINGS_KEY) if isinstance(extra, Mapping) else getattr(extra, SETTINGS_KEY, None)
        return cls.from_mapping(spec.num_speculative_tokens, raw)
