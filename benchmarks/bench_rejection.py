"""Benchmark: vectorised rejection sampler against plain-loop implementations, on CPU or a GPU.

For each batch size and draft length, with Qwen's vocabulary (151,936) in
float32 and point-mass drafts (the model-free drafter's case), it times:

* ``loop``: ``sam_rollout.rejection_loop.rejection_sample_reference``, the
  textbook loop (per request, per position, stops at the first rejection);
* ``vectorised``: ``sam_rollout.rejection.rejection_sample`` with the same pre-drawn
  random numbers (their outputs are checked equal);
* ``vectorised+rng`` and ``loop+rng``: both drawing their own random numbers (the loop
  draws a vocabulary-wide Exp(1) vector for every drafting request, the vectorised
  version only for requests with a rejection);
* if vllm-ascend 0.11.0's ``rejection_sampler.py`` is available (``--ascend-source``,
  default: the copy the contract test caches), its three loop helpers
  (``expand_pytorch``, ``sample_recovered_tokens_pytorch``,
  ``rejection_random_sample_pytorch``) against our drop-in replacements from
  ``benchmarks.ascend_rejection_helpers``, starting from the same target probabilities.

Targets put extra logit mass on the drafts so that most are accepted
(the regime speculative decoding runs in). Times are the best of a few runs, in ms.

Two floors bound what any exact implementation can gain on this machine: every
position whose draft is tested needs a pass over its whole logit row (p(x) needs
the row's normaliser). ``loop softmax`` is the softmax of just the rows the loop
tests (it stops at the first rejection); ``all softmax`` the softmax of every
row, which a batched implementation tests. ``ceiling = loop / all softmax``:
no batched implementation that computes those softmaxes beats the loop by more.

    python -m benchmarks.bench_rejection [--device cpu|cuda] [--json results/bench_rejection.json]
    python -m benchmarks.bench_rejection --count-ops [--accelerator-rows]

``--count-ops`` times nothing: it counts, for one call of each sampler, the tensor
operations dispatched (each one is a kernel launch on a GPU) and the host syncs (reads
of a device value into Python: ``item``, ``tolist``, ``nonzero``), on a small vocabulary.
On a GPU both set a floor under the call at small batch. ``--accelerator-rows``
counts the vectorised sampler as it runs on an accelerator (every request's recovery
row, no ``nonzero``), which a CPU would otherwise not take.

On a GPU every timing waits for the device (``torch.cuda.synchronize``); the loop's per-token ``.item()``
syncs are what the published 10x was measured against.
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sam_rollout.rejection
from benchmarks.ascend_rejection_helpers import REPLACEMENTS
from sam_rollout.rejection import CPU_TILE_BYTES, rejection_sample
from sam_rollout.rejection_loop import rejection_sample_reference

VOCAB_SIZE = 151_936
BATCH_SIZES = (1, 8, 64, 256)
DRAFT_LENGTHS = (3, 4)
DRAFT_LOGIT_BOOST = 14.0  # p(draft) ~ 0.8 against 151,936 standard-normal logits
DEFAULT_ASCEND_SOURCE = Path.home() / ".cache" / "sam-spec-rollout" / "vllm-ascend-0.11.0" / "rejection_sampler.py"
ASCEND_HELPERS = ("expand_pytorch", "sample_recovered_tokens_pytorch", "rejection_random_sample_pytorch")


def synchronize() -> None:
    """Wait for queued device work (a no-op on CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def best_ms(function: Callable[[], object], repetitions: int) -> float:
    """Fastest of several runs: the least disturbed by other load on a shared machine."""
    times = []
    function()  # warm-up: first-call allocations and kernel selection stay out of the timings
    for _ in range(repetitions):
        synchronize()
        start = time.perf_counter()
        function()
        synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def on_device(arguments: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in arguments.items()}


def build_batch(batch_size: int, num_drafts: int, seed: int, vocab_size: int = VOCAB_SIZE) -> tuple[dict, dict]:
    """Sampler arguments and pre-drawn random numbers for one shape (on the CPU)."""
    generator = torch.Generator().manual_seed(seed)
    num_tokens = batch_size * num_drafts
    drafts = torch.randint(0, vocab_size, (num_tokens,), generator=generator, dtype=torch.int32)
    logits = torch.randn(num_tokens, vocab_size, generator=generator)
    logits[torch.arange(num_tokens), drafts.long()] += DRAFT_LOGIT_BOOST
    num_draft_tokens = [num_drafts] * batch_size
    batch = dict(
        draft_token_ids=drafts,
        num_draft_tokens=num_draft_tokens,
        max_spec_len=num_drafts,
        cu_num_draft_tokens=torch.tensor(num_draft_tokens).cumsum(0).to(torch.int32),
        draft_probs=None,
        target_logits=logits,
        bonus_token_ids=torch.randint(0, vocab_size, (batch_size, 1), generator=generator),
        temperature=torch.ones(batch_size),
    )
    randoms = dict(
        uniform_probs=torch.rand(num_tokens, dtype=torch.float64, generator=generator),
        recovery_noise=torch.empty(batch_size, vocab_size).exponential_(generator=generator),
    )
    return batch, randoms


def softmax_ms(logits: torch.Tensor, repetitions: int) -> float:
    """Softmax of the rows in tiles of CPU_TILE_BYTES, as the vectorised sampler computes it."""
    rows_per_tile = max(1, CPU_TILE_BYTES // (4 * logits.shape[1]))
    return best_ms(lambda: [tile.softmax(dim=-1) for tile in torch.split(logits, rows_per_tile)], repetitions)


def rows_the_loop_tests(output: torch.Tensor, drafts: torch.Tensor) -> int:
    """Positions the textbook loop evaluates: the accepted prefix plus the first rejection."""
    num_drafts = drafts.shape[1]
    accepted_prefix = (output[:, :num_drafts] == drafts).int().cumprod(dim=1).sum(dim=1)
    return int(torch.clamp(accepted_prefix + 1, max=num_drafts).sum())


def load_ascend_helpers(source_path: Path) -> dict | None:
    """vllm-ascend's three loop helpers, exec'd from its source with only torch in scope."""
    if not source_path.exists():
        return None
    source = source_path.read_text()
    lines = source.splitlines()
    definitions = [
        "\n".join(lines[node.lineno - 1 : node.end_lineno])
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name in ASCEND_HELPERS
    ]
    namespace: dict = {}
    exec("import torch\n\n" + "\n\n".join(definitions), namespace)
    return {name: namespace[name] for name in ASCEND_HELPERS}


def run_ascend_helpers(helpers: dict, batch: dict, randoms: dict, target_probs: torch.Tensor) -> torch.Tensor:
    """The helper sequence of vllm-ascend 0.11.0's rejection_sample for all-random requests."""
    batch_size = len(batch["num_draft_tokens"])
    num_tokens = target_probs.shape[0]
    cu_num_draft_tokens = batch["cu_num_draft_tokens"]
    device = target_probs.device
    temperature = torch.empty(num_tokens, device=device)
    helpers["expand_pytorch"](temperature, batch["temperature"], cu_num_draft_tokens, -1, 1, 32)
    recovered = torch.empty_like(batch["draft_token_ids"])
    helpers["sample_recovered_tokens_pytorch"](
        recovered,
        cu_num_draft_tokens,
        batch["draft_token_ids"],
        None,
        target_probs,
        randoms["recovery_noise"],
        VOCAB_SIZE,
        IS_NGRAM=True,
    )
    output = torch.full((batch_size, batch["max_spec_len"] + 1), -1, dtype=torch.int32, device=device)
    helpers["rejection_random_sample_pytorch"](
        output,
        cu_num_draft_tokens,
        batch["draft_token_ids"],
        None,
        target_probs,
        batch["bonus_token_ids"],
        recovered,
        randoms["uniform_probs"],
        torch.zeros(batch_size, dtype=torch.bool, device=device),
        batch["max_spec_len"],
        VOCAB_SIZE,
        IS_NGRAM=True,
    )
    return output


def bench_shape(batch_size: int, num_drafts: int, ascend_helpers: dict | None, big: bool, device: str) -> dict:
    batch, randoms = build_batch(batch_size, num_drafts, seed=batch_size * 10 + num_drafts)
    batch, randoms = on_device(batch, device), on_device(randoms, device)
    vectorised_output = rejection_sample(**batch, **randoms)
    loop_output = rejection_sample_reference(**batch, **randoms)
    assert torch.equal(vectorised_output, loop_output), "implementations disagree"
    accepted = (vectorised_output[:, :num_drafts] == batch["draft_token_ids"].view(batch_size, num_drafts)).float()

    loop_repetitions = 2 if big else 5
    row = dict(
        batch_size=batch_size,
        num_drafts=num_drafts,
        acceptance=float(accepted.mean()),
        vectorised_ms=best_ms(lambda: rejection_sample(**batch, **randoms), 5),
        vectorised_rng_ms=best_ms(lambda: rejection_sample(**batch), 5),
        loop_ms=best_ms(lambda: rejection_sample_reference(**batch, **randoms), loop_repetitions),
        loop_rng_ms=best_ms(lambda: rejection_sample_reference(**batch), loop_repetitions),
    )
    row["loop_speedup"] = row["loop_ms"] / row["vectorised_ms"]
    row["loop_rng_speedup"] = row["loop_rng_ms"] / row["vectorised_rng_ms"]
    tested_rows = rows_the_loop_tests(vectorised_output, batch["draft_token_ids"].view(batch_size, num_drafts))
    row["loop_softmax_ms"] = softmax_ms(batch["target_logits"][:tested_rows], 5)
    row["all_softmax_ms"] = softmax_ms(batch["target_logits"], 5)
    row["ratio_ceiling"] = row["loop_ms"] / row["all_softmax_ms"]

    if ascend_helpers is not None:
        target_probs = batch["target_logits"].softmax(dim=-1)
        ours = dict(zip(ASCEND_HELPERS, REPLACEMENTS.values()))
        assert list(REPLACEMENTS) == list(ASCEND_HELPERS)
        assert torch.equal(
            run_ascend_helpers(ours, batch, randoms, target_probs),
            run_ascend_helpers(ascend_helpers, batch, randoms, target_probs),
        )
        row["ascend_loops_ms"] = best_ms(
            lambda: run_ascend_helpers(ascend_helpers, batch, randoms, target_probs), loop_repetitions
        )
        row["ascend_vectorised_ms"] = best_ms(lambda: run_ascend_helpers(ours, batch, randoms, target_probs), 5)
        row["ascend_speedup"] = row["ascend_loops_ms"] / row["ascend_vectorised_ms"]
    return row


# Operators whose result size or value the host must read before it can go on.
SYNCING_OPERATORS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::item")


METADATA_OPERATORS = ("aten::lift_fresh", "aten::scalar_tensor", "aten::split_with_sizes")


class OperationCounter(TorchDispatchMode):
    """Counts the tensor operations dispatched, and host syncs (syncing operators and ``Tensor.tolist``)."""

    def __init__(self) -> None:
        super().__init__()
        self.operations = 0
        self.kernels = 0
        self.syncs = 0
        self._tolist = torch.Tensor.tolist

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.operations += 1
        # Views and host scalars only change metadata; everything else is a kernel on a device.
        if not func.is_view and func._schema.name not in METADATA_OPERATORS:
            self.kernels += 1
        if func._schema.name in SYNCING_OPERATORS:
            self.syncs += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        counter = self
        original_tolist = self._tolist

        def counted_tolist(tensor: torch.Tensor):
            counter.syncs += 1
            return original_tolist(tensor)

        torch.Tensor.tolist = counted_tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


def count_operations(sampler: Callable[..., torch.Tensor], arguments: dict) -> dict:
    """Operations and host syncs of one sampler call."""
    sampler(**arguments)  # first-call work stays out of the count
    with OperationCounter() as counter:
        sampler(**arguments)
    return dict(operations=counter.operations, kernels=counter.kernels, syncs=counter.syncs)


def count_table(batch_sizes: list[int], num_drafts: int, accelerator_rows: bool) -> list[dict]:
    """Operation and sync counts of both samplers, drawing their own random numbers, vocabulary 1,000."""
    rows = []
    original_rule = getattr(sam_rollout.rejection, "recovers_every_request", None)
    if accelerator_rows:
        sam_rollout.rejection.recovers_every_request = lambda device: True
    try:
        for batch_size in batch_sizes:
            batch, _ = build_batch(batch_size, num_drafts, seed=batch_size, vocab_size=1_000)
            rows.append(
                dict(
                    batch_size=batch_size,
                    num_drafts=num_drafts,
                    vectorised=count_operations(rejection_sample, batch),
                    loop=count_operations(rejection_sample_reference, batch),
                )
            )
    finally:
        sam_rollout.rejection.recovers_every_request = original_rule
    return rows


def print_table(rows: list[dict]) -> None:
    with_ascend = "ascend_loops_ms" in rows[0]
    header = (
        f"{'batch':>5} {'k':>2} {'accept':>6} {'loop ms':>9} {'vec ms':>8} {'ratio':>6} "
        f"{'loop+rng':>9} {'vec+rng':>8} {'ratio':>6} "
        f"{'loop softmax':>12} {'all softmax':>11} {'ceiling':>7}"
    )
    if with_ascend:
        header += f" | {'asc-0.11 ms':>11} {'ours ms':>8} {'ratio':>6}"
    print(header)
    for row in rows:
        line = (
            f"{row['batch_size']:>5} {row['num_drafts']:>2} {row['acceptance']:>6.2f} {row['loop_ms']:>9.1f} "
            f"{row['vectorised_ms']:>8.1f} {row['loop_speedup']:>5.1f}x "
            f"{row['loop_rng_ms']:>9.1f} {row['vectorised_rng_ms']:>8.1f} {row['loop_rng_speedup']:>5.1f}x "
            f"{row['loop_softmax_ms']:>12.1f} {row['all_softmax_ms']:>11.1f} {row['ratio_ceiling']:>6.1f}x"
        )
        if with_ascend:
            line += (
                f" | {row['ascend_loops_ms']:>11.1f} {row['ascend_vectorised_ms']:>8.1f} {row['ascend_speedup']:>5.1f}x"
            )
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for a GPU")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--draft-lengths", type=int, nargs="+", default=list(DRAFT_LENGTHS))
    parser.add_argument(
        "--ascend-source",
        type=Path,
        default=DEFAULT_ASCEND_SOURCE,
        help="vllm-ascend 0.11.0 vllm_ascend/sample/rejection_sampler.py (skipped if absent)",
    )
    parser.add_argument("--count-ops", action="store_true", help="count operations and host syncs; time nothing")
    parser.add_argument(
        "--accelerator-rows", action="store_true", help="with --count-ops: the accelerator's recovery rows"
    )
    args = parser.parse_args()

    if args.count_ops:
        for num_drafts in args.draft_lengths:
            for row in count_table(args.batch_sizes, num_drafts, args.accelerator_rows):
                print(
                    f"batch {row['batch_size']:>4} k {num_drafts}: vectorised {row['vectorised']['operations']:>4} ops "
                    f"{row['vectorised']['kernels']:>4} kernels {row['vectorised']['syncs']:>3} syncs | "
                    f"loop {row['loop']['operations']:>5} ops {row['loop']['kernels']:>5} kernels "
                    f"{row['loop']['syncs']:>4} syncs"
                )
        return

    ascend_helpers = load_ascend_helpers(args.ascend_source)
    if ascend_helpers is None:
        print(
            f"vllm-ascend source not found at {args.ascend_source}; skipping its loops "
            "(run tests/test_ascend_rejection_contract.py once to cache it)"
        )
    print(
        f"vocab {VOCAB_SIZE}, float32, point-mass drafts, torch {torch.__version__}, device {args.device}, "
        f"{torch.get_num_threads()} CPU threads"
    )
    rows = []
    for num_drafts in args.draft_lengths:
        for batch_size in args.batch_sizes:
            rows.append(bench_shape(batch_size, num_drafts, ascend_helpers, big=batch_size >= 64, device=args.device))
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                dict(
                    vocab_size=VOCAB_SIZE,
                    dtype="float32",
                    device=args.device,
                    device_name=torch.cuda.get_device_name()
                    if args.device.startswith("cuda")
                    else platform.processor(),
                    torch=torch.__version__,
                    threads=torch.get_num_threads(),
                    machine=platform.machine(),
                    processor=platform.processor(),
                    rows=rows,
                ),
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
