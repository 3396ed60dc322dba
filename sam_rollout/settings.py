"""Engine-side SAM settings: ``additional_config["sam_spec"]``, validated in one place.

k is not a setting here: it is ``speculative_config.num_speculative_tokens``. Every other setting
lives in ``additional_config["sam_spec"]`` because vLLM rejects extra keys in ``speculative_config``:
``switch`` (when to speculate), ``log_interval_s``, and every ``sam.DraftConfig`` field but k.
A bad value raises ValueError naming the setting, so the engine fails at start with that message.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sam_rollout.drafter import DraftConfig
from sam_rollout.drafter.switch import Schedule, threshold_schedule, validate_schedule
from sam_rollout.engine_kwargs import SETTINGS_KEY

WHERE = f"additional_config.{SETTINGS_KEY}"
AUTO = "auto"  # switch: the online switch (sam_rollout.drafter.auto_switch)
SWITCH = "switch"
DEFAULT_SWITCH = 8
DRAFT_KEYS = tuple(f.name for f in fields(DraftConfig) if f.name != "k")
KNOWN_KEYS = (SWITCH, *DRAFT_KEYS, "log_interval_s")

Switch = int | Schedule | str | None  # a threshold, a schedule, AUTO, or None (every step)


@dataclass(frozen=True)
class SamSettings:
    """draft: how the drafter proposes (``sam.DraftConfig``; its k is speculative_config's
        num_speculative_tokens). The prompt store lives in the engine's drafter, so it carries a
        prompt's responses from one RL step to its next visit.
    switch: when to speculate, and with how many tokens; one key, four kinds of value. An integer t:
        in steps that schedule at most t requests (prefills included), k tokens; none above. None
        (null): k tokens in every step. ``[[max_batch, k], ...]`` (strictly increasing max_batch,
        0 <= k <= draft.k): a step scheduling n requests drafts k tokens from the first pair with
        n <= max_batch, none above the last pair (``sam_rollout.drafter.switch``). ``"auto"``: the
        online switch learns this engine's step cost and the drafts' acceptance and chooses k per step
        (``sam_rollout.drafter.auto_switch``). The drafter is kept current in every step either way.
    log_interval_s: log the proposer's own metrics every this many seconds (0 = never).
    """

    draft: DraftConfig = field(default_factory=DraftConfig)
    switch: Switch = DEFAULT_SWITCH
    log_interval_s: float = 0.0

    def __post_init__(self) -> None:
        check_k(self.draft.k)
        object.__setattr__(self, "switch", parse_switch(self.switch, self.draft.k))
        li = self.log_interval_s
        if isinstance(li, bool) or not isinstance(li, (int, float)) or li < 0:
            raise ValueError(f"{WHERE}.log_interval_s must be a number >= 0, got {li!r}")

    def fixed_schedule(self, max_batch: int = sys.maxsize) -> Schedule:
        """The switch as ``((max_batch, k), ...)`` pairs, None (every step) up to ``max_batch``; not for "auto"."""
        if self.switch == AUTO:
            raise ValueError(f'{WHERE}.switch "{AUTO}" has no fixed schedule: it chooses k per step')
        if isinstance(self.switch, tuple):
            return self.switch
        return threshold_schedule(self.switch, self.draft.k, max_batch)

    @classmethod
    def from_mapping(cls, k: int, raw: Mapping[str, Any] | None) -> SamSettings:
        """From ``additional_config.sam_spec`` (None: every default) and k."""
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
        unknown = sorted(set(raw) - set(KNOWN_KEYS))
        if unknown:
            raise ValueError(f"{WHERE}: unknown setting(s) {unknown}; known: {sorted(KNOWN_KEYS)}")
        check_k(k)
        try:
            draft = DraftConfig(k=k, **{name: raw[name] for name in DRAFT_KEYS if name in raw})
        except ValueError as e:  # DraftConfig names the field; say where it came from
            raise ValueError(f"{WHERE}: {e}") from None
        log_interval = {"log_interval_s": raw["log_interval_s"]} if "log_interval_s" in raw else {}
        return cls(draft=draft, switch=raw.get(SWITCH, DEFAULT_SWITCH), **log_interval)

    @classmethod
    def from_vllm_config(cls, vllm_config) -> SamSettings:
        """From a vLLM config object (duck-typed: ``speculative_config`` and ``additional_config``)."""
        spec = vllm_config.speculative_config
        extra = getattr(vllm_config, "additional_config", None) or {}
        raw = extra.get(SETTINGS_KEY) if isinstance(extra, Mapping) else getattr(extra, SETTINGS_KEY, None)
        return cls.from_mapping(spec.num_speculative_tokens, raw)


def check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"speculative_config.num_speculative_tokens must be an integer >= 1, got {k!r}")


def parse_switch(value: Any, k: int) -> Switch:
    """The switch in its one form: an int threshold, a tuple of int pairs, AUTO, or None for every step."""
    where = f"{WHERE}.{SWITCH}"
    if value is None or value == AUTO or _is_threshold(value):
        return value
    if isinstance(value, (str, bool, int, float)):
        raise ValueError(
            f'{where} must be an integer >= 0 (a threshold), null (every step), "{AUTO}", or a list of '
            f"[max_batch, k] pairs, got {value!r}"
        )
    return validate_schedule(value, k, where)


def _is_threshold(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
