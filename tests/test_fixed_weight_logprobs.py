"""The log-prob check's bookkeeping and statistics (evals/fixed_weight_logprobs.py, the ratio of means in
evals/two_sample_stats.py), engine-free: each token's origin from the probe's records, the within-arm
comparison that must not mistake unlikely tokens for a path effect, and the ratio interval on planted
ratios."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evals import fixed_weight_logprobs as fl
from evals import two_sample_stats as stats


def record(tokens, drafts=(), step_drafted=None, discarded=False, rid="r-0abc1234"):
    refs = [-0.5 - i for i in range(len(tokens))]
    drafted = bool(drafts) if step_drafted is None else step_drafted
    return {"req_id": rid, "drafts": list(drafts), "step_drafted": drafted, "tokens": list(tokens),
            "reference": refs, "reference64": refs, "discarded": discarded}  # fmt: skip


def test_each_token_gets_the_origin_of_the_step_that_emitted_it():
    records = [
        record([99], discarded=True),  # a partial prefill's sample: dropped by the engine
        record([5]),  # the prefill's token
        record([6]),  # a decode step without drafts anywhere
        record([7], step_drafted=True),  # no drafts for this row, other rows had some
        record([8, 9, 3, 4], drafts=[8, 9, 3]),  # every draft accepted, then the bonus token
        record([1, 2], drafts=[1, 7, 7]),  # the first accepted, the second rejected: a recovered token
        record([11, 12], drafts=[11]),  # past the response's end (a stop): not returned
    ]
    origins, ref32, _ = fl.token_origins(records, 10)
    assert origins == ["prefill", "plain", "undrafted_row", "accepted_1", "accepted_2", "accepted_3", "bonus",
                       "accepted_1", "recovered", "accepted_1"]  # fmt: skip
    assert ref32[:2] == [-0.5, -0.5] and len(ref32) == 10
    with pytest.raises(ValueError, match="recorded 11 tokens for a response of 12"):
        fl.token_origins(records, 12)


def test_responses_are_matched_to_their_records_by_the_engines_request_id():
    class Arm:  # what fixed_weight_lossless.run_arm returns, the fields read here
        prompt_index = [0, 1]
        tokens = [[5, 6], [7]]
        logprobs = [[-0.1, -0.2], [-0.3]]
        request_ids = ["a", "b"]
        probe = [record([7], rid="b-00000001"), record([5], rid="a-00000002"), record([6], rid="a-00000002")]

    out = fl.responses_with_origins(Arm)
    assert [r["origins"] for r in out] == [["prefill", "plain"], ["prefill"]]
    Arm.probe[2] = record([4], rid="a-00000002")
    with pytest.raises(ValueError, match="the probe's tokens are not the engine's"):
        fl.responses_with_origins(Arm)
    Arm.logprobs = [None, [-0.3]]
    with pytest.raises(ValueError, match="calculate_log_probs off"):
        fl.responses_with_origins(Arm)


def test_sampler_pit_is_uniform_for_a_correct_sampler_and_not_for_a_sharpened_one():
    rng = np.random.default_rng(3)

    def records(sharpen):
        out = []
        for _ in range(4000):
            p = rng.dirichlet(np.full(20, 0.3))
            q = p**sharpen / (p**sharpen).sum()  # what the sampler draws from
            t = int(rng.choice(20, p=q))
            out.append({"discarded": False, "tokens": [t], "reference64": [math.log(p[t])],
                        "mass_above": [float(p[p > p[t]].sum())]})  # fmt: skip
        return type("Arm", (), {"probe": out})

    fair = fl.sampler_pit(records(1.0))
    assert fair["tokens"] == 4000 and abs(fair["z"]) < 3
    assert fl.sampler_pit(records(1.1))["z"] < -4  # tokens 10% sharper than their logits say
    assert fl.sampler_pit(type("Arm", (), {"probe": [record([5])]})) is None  # an older probe's records


def test_engine_only_report_compares_the_arms_likelihood_and_checks_each_sampler():
    def arm(logprobs, sam):
        class Arm:  # what fixed_weight_lossless.run_arm returns, the fields read here
            prompt_index = [i % 2 for i in range(len(logprobs))]
            tokens = [[5] for _ in logprobs]
            request_ids = [f"q{i}" for i in range(len(logprobs))]
            probe = [record([5], rid=f"q{i}-0001") for i in range(len(logprobs))]

        Arm.logprobs, Arm.sam = [[x] for x in logprobs], sam
        return Arm

    lp = list(np.random.default_rng(1).normal(-1.0, 0.5, 60))
    same = fl.engine_only_report({"sam": arm(lp, {"acceptance_length": 2.0}), "baseline": arm(lp, {})})
    assert same["sampled_likelihood"]["mean_engine_logprob_difference_sam_minus_baseline"] == 0
    assert same["arms"]["sam"]["sam"] == {"acceptance_length": 2.0} and same["arms"]["sam"]["tokens"] == 60
    assert same["arms"]["sam"]["sampler_pit"] is None  # these records carry no mass_above
    lower = fl.engine_only_report({"sam": arm([x - 0.5 for x in lp], {}), "baseline": arm(lp, {})})
    d = lower["sampled_likelihood"]
    assert d["mean_engine_logprob_difference_sam_minus_baseline"] == pytest.approx(-0.5) and d["z_p"] < 1e-6


def arm_with_gaps(rng, responses, origin, scale, p_unlikely):
    """Responses of 10 tokens of one origin; a token is unlikely (log-prob about -2) with probability
    ``p_unlikely``, and |delta| = scale x 1e-3 x (1 + |log-prob|) with noise."""
    out, trainer = [], []
    for _ in range(responses):
        lp = [-rng.uniform(1.5, 2.5) if rng.random() < p_unlikely else -rng.uniform(0.02, 0.08) for _ in range(10)]
        engine = [x + scale * 1e-3 * (1 - x) * rng.uniform(0.5, 1.5) for x in lp]
        out.append({"origins": [origin] * 10, "engine": engine})
        trainer.append(lp)
    return out, trainer


def raw_ratio(a, b):
    return np.mean([abs(e - t) for r, tr in zip(*a) for e, t in zip(r["engine"], tr)]) / np.mean(
        [abs(e - t) for r, tr in zip(*b) for e, t in zip(r["engine"], tr)]
    )


def test_drafted_over_decode_compares_tokens_of_equal_likelihood():
    rng = np.random.default_rng(0)
    baseline = arm_with_gaps(rng, 300, "plain", 1.0, p_unlikely=0.2)
    # SAM's drafted tokens mostly unlikely (recovered ones are), no path effect: raw means differ, binned 1
    sam = arm_with_gaps(rng, 300, "recovered", 1.0, p_unlikely=0.8)
    assert raw_ratio(sam, baseline) > 1.5
    d = fl.drafted_against_decode(sam, baseline, reps=1000)
    assert abs(d["ratio"] - 1) < 0.04 and d["ci95"][1] - d["ci95"][0] < 0.1  # sd about 0.01 over seeds
    # a planted path effect: drafted tokens' gaps 1.3x at equal likelihood
    sam = arm_with_gaps(rng, 300, "accepted_2", 1.3, p_unlikely=0.8)
    d = fl.drafted_against_decode(sam, baseline, reps=1000)
    assert d["ci95"][0] > 1.15 and d["ratio"] == pytest.approx(1.3, abs=0.06)
    # undrafted tokens of the SAM arm are not counted as drafted
    assert not fl.drafted_against_decode(arm_with_gaps(rng, 10, "plain", 1.0, 0.5), baseline)["defined"]


def heavy_tailed(rng, n, scale):
    """Per-sequence metrics as k3_kl is: lognormal with a long tail; token counts 10-30; 8 prompts."""
    return scale * rng.lognormal(0, 1.5, n), rng.integers(10, 31, n), np.arange(n) % 8


def test_ratio_of_means_interval_holds_the_planted_ratio_and_states_its_power():
    rng = np.random.default_rng(1)
    a, wa, sa = heavy_tailed(rng, 3000, 1.3e-4)
    b, wb, sb = heavy_tailed(rng, 3000, 1e-4)
    r = stats.weighted_mean_ratio(a, wa, sa, b, wb, sb, reps=2000)
    assert r["log_ratio_defined"] and r["ratio_ci"][0] > 1 and r["ratio_ci"][0] < 1.3 < r["ratio_ci"][1]
    assert r["min_detectable_change"] == pytest.approx(math.exp(2.801585 * r["se_log_ratio"]) - 1, rel=1e-5)
    assert r["min_detectable_change"] < 0.35  # 3,000 a side of this tail resolve about a 31% change
    small = stats.weighted_mean_ratio(a[:100], wa[:100], sa[:100], b[:100], wb[:100], sb[:100], reps=2000)
    assert small["min_detectable_change"] > 2 * r["min_detectable_change"]  # 30x fewer: about 5x the se
    null = stats.weighted_mean_ratio(b[:1500], wb[:1500], sb[:1500], b[1500:], wb[1500:], sb[1500:], reps=2000)
    assert null["ratio_ci"][0] < 1 < null["ratio_ci"][1]


def test_ratio_of_means_of_a_negative_metric_and_of_one_that_changes_sign():
    rng = np.random.default_rng(2)
    a, wa, sa = heavy_tailed(rng, 400, 1e-5)
    b, wb, sb = heavy_tailed(rng, 400, 1e-5)
    neg = stats.weighted_mean_ratio(-a, wa, sa, -b, wb, sb, reps=500)  # chi2_token below 0: ratio of magnitudes
    pos = stats.weighted_mean_ratio(a, wa, sa, b, wb, sb, reps=500)
    assert neg["log_ratio_defined"] and neg["ratio_ci"] == pytest.approx(pos["ratio_ci"])
    mixed = stats.weighted_mean_ratio(a - a.mean(), wa, sa, b, wb, sb, reps=500)  # mean about 0
    assert not mixed["log_ratio_defined"] and mixed["draws_changing_sign"] > 0


@pytest.mark.parametrize(
    "cis,mdcs,rejected,expected",
    [
        ([(0.9, 1.1), (0.95, 1.08)], [0.15, 0.12], [], "agree"),
        ([(0.9, 1.1), (0.95, 1.08)], [0.15, 0.25], [], "underpowered"),
        ([(1.05, 1.4), (0.95, 1.08)], [0.15, 0.12], [], "differ"),
        ([(0.9, 1.1), (0.95, 1.08)], [0.15, 0.12], ["k3_kl (z_p)"], "differ"),
    ],
)
def test_verdict(cis, mdcs, rejected, expected):
    ratios = {m: {"log_ratio_defined": True, "ratio_ci": list(ci), "min_detectable_change": mdc}
              for m, ci, mdc in zip(fl.RATIO_METRICS, cis, mdcs)}  # fmt: skip
    assert fl.verdict(ratios, rejected) == expected
    ratios[fl.RATIO_METRICS[-1]] = {"log_ratio_defined": False}  # no interval: never "agree"
    assert fl.verdict(ratios, rejected) == ("differ" if expected == "differ" else "underpowered")


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
RUNS = sorted(
    p.name for p in RESULTS.glob("fixed_weight_logprobs_*.json") if not {"pooled", "engine"} & set(p.stem.split("_"))
)


@pytest.mark.parametrize("name", RUNS)
def test_each_artifact_recomputes_from_its_responses(name):
    """The comparison (ratios, intervals, tests, verdict) recomputes from the per-response metrics the
    artifact keeps, and the token means from them are verl's float64 batch values it reports."""
    report = json.loads((RESULTS / name).read_text())
    assert report["arms"]["sam"]["sam"]["accepted_tokens"] > 0 and "accepted_1" in report["arms"]["sam"]["by_origin"]
    again = fl.rounded(fl.compare(report["arms"]))
    saved = report["comparison"]
    assert again["ratio_of_means"] == saved["ratio_of_means"] and again["tests"] == saved["tests"]
    assert again["verdict"] == saved["verdict"]
    for arm in report["arms"].values():
        tokens = np.asarray(arm["n_tokens"], dtype=np.float64)
        k3 = np.dot(arm["per_response"]["k3_kl"], tokens) / tokens.sum()
        assert k3 == pytest.approx(arm["rollout_corr_fp64"]["k3_kl"], rel=1e-3)


def test_pooled_artifacts_recompute_from_their_runs():
    for path in RESULTS.glob("fixed_weight_logprobs_*pooled*.json"):
        saved = json.loads(path.read_text())
        runs = [json.loads((RESULTS / Path(p).name).read_text()) for p in saved["reports"]]
        again = fl.rounded(fl.pooled_report(runs))
        assert again["comparison"]["ratio_of_means"] == saved["comparison"]["ratio_of_means"], path.name
