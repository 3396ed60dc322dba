"""Drafting cost, side by side in one run: per request-step, build per token, bytes per token.

A request-step appends the tokens a verification step accepted (1 to 4, at random) and proposes
k = 3. Contexts are windows of real responses tokenised with Qwen3's tokenizer. SAM is timed on the
engine's path (``SamStepper.step``, called as the vLLM adapter calls it) unless a configuration names
another path; peers are timed on the same windows, one request at a time, as their engines call them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from sam_rollout.drafter import BatchDrafter, DraftConfig, pages
from sam_rollout.settings import SamSettings
from sam_rollout.stepper import SamStepper

# how a configuration's drafter is driven in each engine step
STEPPER = "stepper"  # SamStepper.step as sam_rollout.vllm.proposer calls it: the engine's path
DRAFTER_CALLS = "sync+propose"  # only the stepper's two drafter calls, in its order
FUSED = "fused"  # BatchDrafter.step: sync and propose in one compiled call (no engine calls it)
PATHS = (STEPPER, DRAFTER_CALLS, FUSED)

# one engine step of a started batch: (row lengths after the step, each row's accepted tokens)
StepCall = Callable[[np.ndarray, list[list[int]]], object]


@dataclass(frozen=True)
class Siblings:
    """The timed batch as GRPO groups: each `size` consecutive rows share their first `prompt_tokens`
    tokens (the prompt; the rest of a row is that sibling's own text). With `stored`, configurations
    with the prompt store on start as a revisit: the store holds an earlier visit in which every
    sibling wrote what its row holds, so matches run as long as the rows (the longest drafts)."""

    size: int = 16
    prompt_tokens: int = 512
    stored: bool = True

    def __post_init__(self):
        if self.size < 1 or self.prompt_tokens < 1:
            raise ValueError(f"siblings need size >= 1 and prompt_tokens >= 1, got {self}")

    def group(self, rows: np.ndarray, context: int) -> None:
        """Give each group's rows its first row's prompt, in place."""
        if self.prompt_tokens >= context:
            raise ValueError(f"a {self.prompt_tokens}-token prompt leaves no own text in a {context}-token context")
        for first in range(0, len(rows), self.size):
            rows[first : first + self.size, : self.prompt_tokens] = rows[first, : self.prompt_tokens]


def _windows(corpus: np.ndarray, context: int, count: int, rng) -> list[int]:
    return [int(o) for o in rng.integers(0, len(corpus) - context - 4096, size=count)]


def _store_earlier_visit(stepper: SamStepper, rows: np.ndarray, prompt_lengths: np.ndarray) -> None:
    """An earlier visit of every row's prompt that wrote the whole row, finished into the prompt store."""
    earlier = [f"earlier-{b}" for b in range(len(rows))]
    whole = np.full(len(rows), rows.shape[1], dtype=np.int32)
    stepper.step(earlier, prompt_lengths, [[] for _ in earlier], whole, rows)
    for req_id in earlier:
        stepper.finish(req_id)


def start_batch(
    config: DraftConfig, path: str, rows: np.ndarray, context: int, k: int | None, siblings: Siblings | None = None
) -> StepCall:
    """Start one request per row of `rows` (int32, as vLLM's token_ids_cpu) from its first `context`
    tokens, driven on `path`; returns the call for one engine step. k None: the configuration's k.
    siblings: the rows are grouped (`Siblings.group`); only the engine's path takes groups."""
    if path not in PATHS:
        raise ValueError(f"unknown drafting path {path!r}; one of {PATHS}")
    req_ids = [f"req-{b}" for b in range(len(rows))]  # vLLM's request ids are strings
    if path == STEPPER:
        stepper = SamStepper(SamSettings(draft=config, switch=None), max_model_len=rows.shape[1])  # drafts every step
        prompt = context if siblings is None else siblings.prompt_tokens
        prompt_lengths = np.full(len(rows), prompt, dtype=np.int32)
        if siblings is not None and siblings.stored and config.prompt_store:
            _store_earlier_visit(stepper, rows, prompt_lengths)
        started = np.full(len(rows), context, dtype=np.int32)
        stepper.step(req_ids, prompt_lengths, [[] for _ in req_ids], started, rows)  # the prefill: starts all
        return lambda lengths, accepted: stepper.step(req_ids, prompt_lengths, accepted, lengths, rows, k=k)
    if siblings is not None:
        raise ValueError(f"siblings are timed on the engine's path ({STEPPER!r}) only, not {path!r}")
    drafter = BatchDrafter(config)
    for rid, row in zip(req_ids, rows):
        drafter.start(rid, row[:context])
    if path == FUSED:
        return lambda lengths, accepted: drafter.step(req_ids, rows, lengths, k)

    def sync_then_propose(lengths, accepted):
        drafter.sync(req_ids, rows, lengths)
        return drafter.propose(req_ids, k)

    return sync_then_propose


def sam_step_us(
    corpus: np.ndarray,
    context: int,
    batch: int,
    configs: dict[str, DraftConfig],
    steps: int = 200,
    k: int | None = 3,
    seed: int = 0,
    small_pages: frozenset[str] = frozenset(),
    paths: Mapping[str, str] | None = None,
    siblings: Siblings | None = None,
) -> dict[str, dict[str, float]]:
    """Microseconds per request for one engine step, each configuration's drafter side by side on the
    same windows: every step appends each request's accepted tokens from a token table (as vLLM's
    token_ids_cpu) and proposes. The drafters take turns within every step (in alternating order),
    so a shared machine's changing speed weighs on all alike. Requests draft from their own context,
    or, with `siblings`, from their group's and their stored responses too (each configuration's settings).

    paths: {configuration: path} (`PATHS`) for those not driven through `SamStepper` (`STEPPER`).
    The configurations named in `small_pages` keep their automata in 4 KiB pages (sam_rollout.drafter.pages
    switched off while they start and step), so that the huge pages' gain is measured in the same steps.

    k: the draft cap of every configuration's steps; None: each configuration's own k.

    Returns, per configuration, the median us per request-step, the median of its per-step ratio
    to the first configuration's, and the tokens it drafted per request-step."""
    paths = dict(paths or {})
    if set(paths) - set(configs):
        raise ValueError(f"paths names configurations that are not timed: {sorted(set(paths) - set(configs))}")
    rng = np.random.default_rng(seed)
    starts = _windows(corpus, context, batch, rng)
    width = context + 4 * (steps + 10)
    rows = np.stack([corpus[off : off + width] for off in starts]).astype(np.int32)
    if siblings is not None:
        siblings.group(rows, context)
    step_calls = {}
    for name, config in configs.items():
        with _pages(name in small_pages):
            step_calls[name] = start_batch(config, paths.get(name, STEPPER), rows, context, k, siblings)
    lengths = np.full(batch, context, dtype=np.int32)  # vLLM's num_tokens_no_spec
    per_request: dict[str, list[float]] = {name: [] for name in step_calls}
    drafted = dict.fromkeys(step_calls, 0)
    names = list(step_calls)
    for step in range(steps + 10):
        before, lengths = lengths, lengths + rng.integers(1, 5, size=batch).astype(np.int32)
        accepted = [rows[b, before[b] : lengths[b]].tolist() for b in range(batch)]  # the engine's sampled ids
        for name in names if step % 2 == 0 else names[::-1]:
            with _pages(name in small_pages):
                t0 = time.perf_counter()
                drafts = step_calls[name](lengths, accepted)
                elapsed = time.perf_counter() - t0
            if step >= 10:  # warm-up steps touch cold caches
                per_request[name].append(elapsed / batch * 1e6)
                drafted[name] += _drafted_tokens(drafts)
    base = np.asarray(per_request[names[0]])
    return {
        name: {
            "us": float(np.median(us)),
            "ratio": float(np.median(np.asarray(us) / base)),
            "drafted_per_row_step": drafted[name] / (batch * steps),
        }
        for name, us in per_request.items()
    }


def _drafted_tokens(drafts) -> int:
    """Tokens drafted in one step: the engine's path returns lists, the drafter's a Proposal."""
    if isinstance(drafts, list):
        return sum(len(d) for d in drafts)
    return int(drafts.lengths.sum())


@contextlib.contextmanager
def _pages(small: bool):
    """sam_rollout.drafter.pages switched off (4 KiB pages) for what runs inside, when `small`."""
    before = os.environ.get(pages.DISABLE_ENV)
    if small:
        os.environ[pages.DISABLE_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(pages.DISABLE_ENV, None)
        else:
            os.environ[pages.DISABLE_ENV] = before


def sam_build(
    corpus: np.ndarray, tokens: int, repeats: int = 5, config: DraftConfig | None = None
) -> tuple[float, float]:
    """(microseconds per token, bytes per token) to build one request's automaton from scratch."""
    times, nbytes = [], 0
    for r in range(repeats + 1):
        drafter = BatchDrafter(config or DraftConfig(group_aware=False))
        t0 = time.perf_counter()
        drafter.start(0, corpus[r * 1000 : r * 1000 + tokens])
        elapsed = time.perf_counter() - t0
        if r:  # the first build also loads compiled code
            times.append(elapsed / tokens * 1e6)
        nbytes = drafter.nbytes
    return float(np.median(times)), nbytes / tokens


def vllm_ngram_step_us(
    corpus: np.ndarray, context: int, min_n: int = 5, max_n: int = 5, steps: int = 200, k: int = 3, seed: int = 0
) -> float:
    """Median microseconds per request-step of vLLM's n-gram core, which rescans the context."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find

    rng = np.random.default_rng(seed)
    (off,) = _windows(corpus, context, 1, rng)
    end = off + context
    find(corpus[off:end], min_n, max_n, 1 << 30, k)
    times = []
    for _ in range(steps):
        end += int(rng.integers(1, 5))
        t0 = time.perf_counter()
        find(corpus[off:end], min_n, max_n, 1 << 30, k)
        times.append((time.perf_counter() - t0) * 1e6)
    return float(np.median(times))


def arctic_step_us(corpus: np.ndarray, context: int, steps: int = 200, k: int = 3, seed: int = 0) -> float:
    """Median microseconds per request-step of Arctic suffix decoding (append, then speculate)."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    rng = np.random.default_rng(seed)
    (off,) = _windows(corpus, context, 1, rng)
    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
    cache.start_request("r", corpus[off : off + context].tolist())
    end = off + context
    times = []
    for _ in range(steps):
        n = int(rng.integers(1, 5))
        new = corpus[end : end + n].tolist()
        end += n
        t0 = time.perf_counter()
        cache.add_active_response("r", new)
        cache.speculate(
            "r", corpus[end - 24 : end].tolist(), max_spec_tokens=k, max_spec_factor=1.0, min_token_prob=0.1
        )
        times.append((time.perf_counter() - t0) * 1e6)
    cache.stop_request("r")
    return float(np.median(times))


def anchor_steps(path) -> dict[tuple[int, int], float]:
    """{(batch, context): ms of a plain decode step (q = 1, unmasked)} from a step-cost anchor CSV
    (../shared/data/anchors/step_cost_h200_*.csv)."""
    import csv

    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["q"]) == 1 and row.get("masked", "0") in ("0", "False", "false"):
                ms = next(v for key, v in row.items() if key.startswith("ms_per_step"))
                out[(int(row["batch"]), int(row["ctx"]))] = float(ms)
    return out


def anchor_shares(
    corpus: np.ndarray,
    anchor: dict[tuple[int, int], float],
    configs: dict[str, DraftConfig],
    repeats: int,
    siblings: Siblings | None = None,
) -> dict[str, dict]:
    """Per anchor shape and configuration: the drafter's time for one engine step of that batch (the
    median us per request-step x batch, `sam_step_us`, each repeat on other windows) as a share of the
    anchor's plain decode step; the median over the repeats and their range, and the tokens drafted per
    request-step (mean over the repeats). siblings: as `sam_step_us`."""
    out = {}
    for (batch, context), step_ms in sorted(anchor.items()):
        per_config: dict[str, list[float]] = {name: [] for name in configs}
        drafted: dict[str, list[float]] = {name: [] for name in configs}
        for repeat in range(repeats):
            timed = sam_step_us(corpus, context, batch, configs, steps=100, k=None, seed=repeat, siblings=siblings)
            for name, t in timed.items():
                per_config[name].append(t["us"] * batch / (step_ms * 1e3))
                drafted[name].append(t["drafted_per_row_step"])
        out[f"batch {batch}, context {context}"] = {
            "anchor_step_ms": step_ms,
            **{
                name: {
                    "share_median": float(np.median(s)),
                    "share_min": min(s),
                    "share_max": max(s),
                    "drafted_per_row_step": float(np.mean(drafted[name])),
                }
                for name, s in per_config.items()
            },
        }
        print(
            f"  batch {batch} context {context}: "
            + ", ".join(
                f"{n} {100 * np.median(s):.2f}% ({100 * min(s):.2f}-{100 * max(s):.2f})" for n, s in per_config.items()
            ),
            flush=True,
        )
    return out
