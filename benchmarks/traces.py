"""Trace files: sampled rollouts (prompt and response token ids per group) with the settings that made them.

One compressed ``.npz`` holds, for G groups (prompts) and R responses in all:

- ``prompt_tokens`` / ``prompt_offsets`` [G+1]: the prompts, concatenated;
- ``response_tokens`` / ``response_offsets`` [R+1]: the responses, concatenated, group by group;
- ``response_group`` [R]: the group of each response; ``finish_reasons`` [R] (``stop``, ``length``, ...);
- ``group_prompt_index`` [G]: each group's index in the prompt list it was drawn from;
- ``settings_json``: model, dtype, engine version, seed, date, vocabulary size, ... as a JSON string.

Token ids are stored in the smallest unsigned type that holds the vocabulary (uint16 for SmolLM2's 49,152)
and read back as int32. No pickled objects: files load with ``allow_pickle=False``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from testkit.data import TraceGroup

FORMAT = "sam-spec-rollout/traces/v1"
QWEN25MATH = "qwen25math"  # the shared Qwen2.5-Math traces, tokenised on load
_ARRAYS = (
    "prompt_tokens",
    "prompt_offsets",
    "response_tokens",
    "response_offsets",
    "response_group",
    "finish_reasons",
    "group_prompt_index",
    "settings_json",
)


class TraceFileError(ValueError):
    """A trace file that is missing, unreadable or not in this format."""


@dataclass
class SampledGroup:
    """One prompt's sampled responses as the generator records them."""

    prompt_index: int
    prompt: np.ndarray
    responses: list[np.ndarray]
    finish_reasons: list[str] = field(default_factory=list)


def _token_dtype(vocab_size: int) -> np.dtype:
    if vocab_size <= np.iinfo(np.uint16).max + 1:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def _concat(rows: list[np.ndarray], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]) if rows else np.zeros(0, np.int64)
    return flat.astype(dtype), offsets


def _check_ids(groups: list[SampledGroup], vocab_size: int) -> None:
    for g in groups:
        for row in [g.prompt, *g.responses]:
            row = np.asarray(row)
            if row.size and (row.min() < 0 or row.max() >= vocab_size):
                raise ValueError(f"group {g.prompt_index}: token id outside [0, {vocab_size})")
        if len(g.finish_reasons) != len(g.responses):
            raise ValueError(
                f"group {g.prompt_index}: {len(g.responses)} responses but {len(g.finish_reasons)} finish reasons"
            )


def write_traces(path: str | os.PathLike, groups: list[SampledGroup], settings: dict) -> Path:
    """Write groups (sorted by prompt index) and settings; atomic (temp file + rename), so a reader never
    sees half a file and a generator can rewrite it after every finished group."""
    if "vocab_size" not in settings:
        raise ValueError("settings must name vocab_size (it fixes the stored token type)")
    vocab_size = int(settings["vocab_size"])
    groups = sorted(groups, key=lambda g: g.prompt_index)
    _check_ids(groups, vocab_size)
    dtype = _token_dtype(vocab_size)
    prompt_tokens, prompt_offsets = _concat([g.prompt for g in groups], dtype)
    responses = [r for g in groups for r in g.responses]
    response_tokens, response_offsets = _concat(responses, dtype)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(
        tmp,
        prompt_tokens=prompt_tokens,
        prompt_offsets=prompt_offsets,
        response_tokens=response_tokens,
        response_offsets=response_offsets,
        response_group=np.repeat(np.arange(len(groups)), [len(g.responses) for g in groups]).astype(np.int32),
        finish_reasons=np.asarray([f for g in groups for f in g.finish_reasons], dtype=np.str_),
        group_prompt_index=np.asarray([g.prompt_index for g in groups], dtype=np.int64),
        settings_json=np.asarray(json.dumps({"format": FORMAT, **settings}, sort_keys=True)),
    )
    os.replace(tmp, path)
    return path


def _open(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise TraceFileError(f"{path}: no such trace file")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [name for name in _ARRAYS if name not in z.files]
            if missing:
                raise TraceFileError(f"{path}: not a trace file (missing {', '.join(missing)})")
            return {name: z[name] for name in _ARRAYS}
    except TraceFileError:
        raise
    except Exception as e:  # zip, pickle or header errors from numpy
        raise TraceFileError(f"{path}: not a readable .npz trace file ({type(e).__name__}: {e})") from e


def _settings(path: Path, arrays: dict[str, np.ndarray]) -> dict:
    try:
        settings = json.loads(str(arrays["settings_json"]))
    except json.JSONDecodeError as e:
        raise TraceFileError(f"{path}: settings_json is not JSON ({e})") from e
    if settings.get("format") != FORMAT:
        raise TraceFileError(f"{path}: format {settings.get('format')!r}, expected {FORMAT!r}")
    return settings


def _split(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    flat = flat.astype(np.int32)
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def read_traces(path: str | os.PathLike) -> tuple[list[SampledGroup], dict]:
    """The groups (in prompt order) and settings of a trace file; TraceFileError if it is not one."""
    path = Path(path)
    a = _open(path)
    settings = _settings(path, a)
    prompts = _split(a["prompt_tokens"], a["prompt_offsets"])
    responses = _split(a["response_tokens"], a["response_offsets"])
    if not (
        len(prompts) == len(a["group_prompt_index"])
        and len(responses) == len(a["response_group"]) == len(a["finish_reasons"])
    ):
        raise TraceFileError(f"{path}: array lengths disagree")
    groups = [SampledGroup(int(i), p, []) for i, p in zip(a["group_prompt_index"], prompts)]
    for g, r, reason in zip(a["response_group"], responses, a["finish_reasons"]):
        groups[g].responses.append(r)
        groups[g].finish_reasons.append(str(reason))
    return groups, settings


def load_trace_file(path: str | os.PathLike, limit: int | None = None) -> list[TraceGroup]:
    """A trace file as the replay's TraceGroup objects (int32 ids), in prompt order."""
    groups, _ = read_traces(path)
    return [TraceGroup(g.prompt, g.responses) for g in groups[:limit]]


def load_trace_set(source: str, limit: int | None = None) -> tuple[str, list[TraceGroup]]:
    """'qwen25math' (the shared traces, Qwen3 tokenizer) or a trace file (.npz) -> (name, groups)."""
    if source == QWEN25MATH:
        from testkit.data import load_trace_groups

        return QWEN25MATH, load_trace_groups(limit)
    return Path(source).stem, load_trace_file(source, limit)
