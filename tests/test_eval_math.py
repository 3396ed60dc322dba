"""The math accuracy check without an engine: answer scoring, the two-arm statistics on fixed synthetic
outcomes (verdict known in both directions), problem loading, the report, the plot and the CLI's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require, require_module

from evals import eval_math as em
from evals.eval_math_stats import (
    CHANGED,
    MIN_PROBLEMS,
    MIN_SAMPLES_PER_ARM,
    NO_CHANGE,
    UNDERPOWERED,
    arm_summary,
    compare_arms,
    paired_difference,
    sized_verdict,
    stratified_permutation_test,
    student_t_quantile,
)
from evals.math_answers import INVALID, builtin_score, get_scorer, last_boxed, normalize_final_answer

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------

KNOWN = [  # response, ground truth, correct, pred, via
    ("So the walk takes 204 minutes.\nAnswer: 204", "204", True, "204", "answer_line"),
    ("Answer: $x = 5$", "5", True, "5", "answer_line"),  # text after the last '=' only
    ("answer : \\frac12", "\\frac{1}{2}", True, "\\frac{1}{2}", "answer_line"),  # shorthand TeX expanded
    ("Answer: 1,234 dollars", "1234", True, "1234", "answer_line"),  # units and separators dropped
    ("Answer: 106^\\circ", "106^\\circ", True, "106", "answer_line"),
    ("Answer: 3\nAnswer: 4", "4", True, "4", "answer_line"),  # the last line counts
    ("\\boxed{5} and then Answer: 6", "5", False, "6", "answer_line"),  # Answer: wins over \boxed
    ("so \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}", True, "\\frac{1}{\\sqrt{2}}", "boxed"),  # nested
    ("\\boxed{106^\\circ}", "106", False, "106^\\circ", "boxed"),  # the boxed path is not normalised
    ("\\boxed{7}" + "x" * 150, "7", False, INVALID, "none"),  # \boxed only in the last 100 characters
    ("Answer: 7" + "x" * 300, "7", False, INVALID, "none"),  # Answer: only in the last 300 characters
    ("\\boxed{3", "3", False, INVALID, "none"),  # never closed
    ("I do not know.", "3", False, INVALID, "none"),
]


@pytest.mark.parametrize("response,truth,correct,pred,via", KNOWN)
def test_builtin_scorer_on_known_strings(response, truth, correct, pred, via):
    s = builtin_score(response, truth)
    assert (s.correct, s.pred, s.via) == (correct, pred, via)


def test_last_boxed_and_normalisation():
    assert last_boxed("a \\boxed{1} b \\boxed{{2}+\\{x\\}}") == "{2}+\\{x\\}"
    assert last_boxed("no box") is None
    assert normalize_final_answer("\\text{(B)}") == "(B)"
    assert normalize_final_answer("$\\sqrt2$") == "\\sqrt{2}"
    assert normalize_final_answer("10 cm") == "10"


def test_get_scorer_choices():
    name, score = get_scorer("builtin")
    assert name.startswith("builtin") and score is builtin_score
    with pytest.raises(ValueError):
        get_scorer("sympy")


# --------------------------------------------------------------------------------------------
# Statistics on fixed synthetic outcomes
# --------------------------------------------------------------------------------------------


def outcomes(p_per_problem, n, seed):
    rng = np.random.default_rng(seed)
    return rng.random((len(p_per_problem), n)) < np.asarray(p_per_problem)[:, None]


def test_t_quantiles_match_tables():
    for df, expected in [(1, 12.7062), (3, 3.1824), (10, 2.2281), (30, 2.0423), (1000, 1.9623)]:
        assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_identical_arms_no_change():
    off = outcomes(np.linspace(0.1, 0.9, 40), 8, seed=1)
    r = compare_arms(off, off.copy())
    d = r["difference"]
    assert d["difference"] == 0 and d["ci"] == [0, 0] and d["p_value"] == 1.0
    assert d["verdict"] == NO_CHANGE
    assert r["off"] == r["on"]


def test_same_accuracy_resampled_no_change():
    """Both arms sample from the same per-problem accuracies (independent draws): no change."""
    p = np.random.default_rng(2).uniform(0.05, 0.95, 200)
    r = paired_difference(outcomes(p, 8, seed=3), outcomes(p, 8, seed=4))
    assert r["verdict"] == NO_CHANGE, r
    assert r["ci"][0] < 0 < r["ci"][1]


@pytest.mark.parametrize("shift", [-0.2, +0.2])
def test_real_shift_is_changed_in_both_directions(shift):
    p = np.random.default_rng(5).uniform(0.25, 0.75, 200)
    off, on = outcomes(p, 8, seed=6), outcomes(np.clip(p + shift, 0, 1), 8, seed=7)
    r = paired_difference(off, on)
    assert r["verdict"] == CHANGED, r
    assert np.sign(r["difference"]) == np.sign(shift)
    assert r["ci"][0] <= r["difference"] <= r["ci"][1]
    assert r["p_value"] < 0.05


def test_false_positive_rate_is_alpha():
    """Arms drawn from the same per-problem accuracies: 'changed' in about alpha of the trials."""
    rng = np.random.default_rng(12)
    p = rng.uniform(0.0, 0.4, 30)  # AIME-like: 30 problems, mostly hard
    verdicts = [
        paired_difference(rng.random((30, 8)) < p[:, None], rng.random((30, 8)) < p[:, None])["verdict"]
        for _ in range(400)
    ]
    assert 0.02 <= verdicts.count(CHANGED) / 400 <= 0.09


def test_permutation_test_exact_small_case():
    # one problem, off [0, 0], on [1, 1]: 2 of the 6 label splits are as extreme -> p = 1/3
    assert stratified_permutation_test([[0, 0]], [[1, 1]]) == pytest.approx(1 / 3, abs=0.02)
    assert stratified_permutation_test([[5.0, 5.0]] * 3, [[5.0, 5.0]] * 3) == 1.0  # nothing moves
    rng = np.random.default_rng(13)
    shifted = stratified_permutation_test(
        [rng.normal(0, 1, 4) for _ in range(30)], [rng.normal(-1, 1, 4) for _ in range(30)]
    )
    assert shifted < 0.001


def test_paired_difference_by_hand():
    # per-problem differences 0.5, 0, 0.5, 1: mean 0.5, sd 0.4082, se 0.2041, t(0.975, 3) = 3.1824
    off = np.array([[0, 0], [1, 1], [0, 1], [0, 0]], dtype=bool)
    on = np.array([[1, 0], [1, 1], [1, 1], [1, 1]], dtype=bool)
    r = paired_difference(off, on)
    assert r["difference"] == pytest.approx(0.5)
    assert r["se"] == pytest.approx(0.20412, abs=1e-5)
    assert r["ci"] == pytest.approx([0.5 - 0.64959, 0.5 + 0.64959], abs=1e-4)
    assert r["verdict"] == NO_CHANGE and r["df"] == 3
    assert (r["problems_better_on"], r["problems_worse_on"]) == (3, 0)


def test_pairing_beats_unpaired_noise():
    """Problems differ wildly in difficulty; the arms differ by a small, consistent amount. Pairing by
    problem removes the difficulty spread, so the shift is detected though the arm intervals overlap."""
    p = np.repeat([0.0, 1.0], 50)
    off = np.tile(p[:, None], (1, 10)).astype(bool)
    on = off.copy()
    on[0:50:2, 0] = True  # half of the unsolved problems: one sample of ten now right (d = +0.1)
    r = compare_arms(off, on)
    assert r["difference"]["difference"] == pytest.approx(0.025)
    assert r["difference"]["verdict"] == CHANGED
    lo_off, hi_off = r["off"]["ci"]
    assert lo_off < r["on"]["pass_at_1"] < hi_off


def test_arm_interval():
    zeros = np.zeros((4, 2), dtype=bool)
    s = arm_summary(zeros)
    assert s["pass_at_1"] == 0 and s["design_effect"] == 2  # all equal: one observation per problem
    assert s["ci"][0] == 0 and s["ci"][1] == pytest.approx(1.96**2 / (4 + 1.96**2), abs=1e-3)
    mixed = outcomes(np.linspace(0.1, 0.9, 50), 4, seed=8)
    m = arm_summary(mixed)
    assert m["ci"][0] < m["pass_at_1"] < m["ci"][1]
    assert m["pass_at_1"] == pytest.approx(mixed.mean(axis=1).mean())
    assert 1 <= m["design_effect"] <= 4


def test_statistics_reject_bad_input():
    with pytest.raises(ValueError, match="at least 2 problems"):
        paired_difference(np.ones((1, 4)), np.ones((1, 4)))
    with pytest.raises(ValueError, match="same problems"):
        paired_difference(np.ones((3, 4)), np.ones((4, 4)))
    with pytest.raises(ValueError, match="0/1"):
        arm_summary(np.full((3, 2), 0.5))


# --------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------


def _shared_problems_present() -> bool:
    try:
        return em.default_dataset_path("aime2024").is_file() and em.default_dataset_path("math500").is_file()
    except FileNotFoundError:
        return False


def test_shared_datasets_load():
    require(_shared_problems_present(), "shared data (problems/) not found; set SAM_SHARED_DIR")
    aime = em.load_problems("aime2024")
    assert len(aime) == 30 and aime[0].answer == "204"
    assert "boxed" not in aime[0].question  # the file's instruction is stripped; --prompt-style adds one
    math500 = em.load_problems("math500", limit=5)
    assert len(math500) == 5 and {p.dataset for p in math500} == {"math500"}
    assert len(em.load_problems("math500")) == 500
    assert "Answer:" in em.format_prompt(aime[0], "dapo")
    assert "\\boxed{}" in em.format_prompt(aime[0], "boxed")


def test_gsm8k_layouts(tmp_path):
    jl = tmp_path / "gsm8k.jsonl"
    jl.write_text(
        json.dumps(
            {"question": "Tom has 1,000 apples and buys 234 more. How many?", "answer": "1000 + 234 = 1234\n#### 1,234"}
        )
        + "\n"
    )
    (p,) = em.load_problems("gsm8k", jl)
    assert p.answer == "1234" and p.question.startswith("Tom")
    assert builtin_score("Answer: 1,234", p.answer).correct
    pq = require_module("pyarrow.parquet")
    pa = require_module("pyarrow")

    verl_rows = [{"prompt": [{"role": "user", "content": "What is 2+3?"}], "reward_model": {"ground_truth": "5"}}]
    pq.write_table(pa.Table.from_pylist(verl_rows), tmp_path / "gsm8k.parquet")
    (q,) = em.load_problems("gsm8k", tmp_path / "gsm8k.parquet")
    assert (q.question, q.answer) == ("What is 2+3?", "5")


def test_problem_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        em.load_problems("gsm8k", tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no gsm8k problems"):
        em.load_problems("gsm8k", tmp_path / "empty.jsonl")
    (tmp_path / "odd.jsonl").write_text(json.dumps({"text": "?"}) + "\n")
    with pytest.raises(ValueError, match="neither question"):
        em.load_problems("gsm8k", tmp_path / "odd.jsonl")
    with pytest.raises(ValueError, match="give its file"):
        em.load_problems("gsm8k")
    with pytest.raises(ValueError, match="limit"):
        em.load_problems("gsm8k", tmp_path / "odd.jsonl", limit=0)


def test_check_model(tmp_path):
    em.check_model("Qwen/Qwen3-32B")  # a hub id passes (loaded later)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        em.check_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        em.check_model(str(tmp_path))


# --------------------------------------------------------------------------------------------
# Report and plot from synthetic arms
# --------------------------------------------------------------------------------------------


def test_small_runs_claim_no_verdict():
    assert sized_verdict(CHANGED, MIN_PROBLEMS, MIN_SAMPLES_PER_ARM) == CHANGED
    assert sized_verdict(NO_CHANGE, MIN_PROBLEMS, MIN_SAMPLES_PER_ARM) == NO_CHANGE
    small = sized_verdict(CHANGED, 8, 16)  # the smoke run's default size
    assert small.startswith(UNDERPOWERED) and "8 problems, 16 samples per arm" in small
    assert sized_verdict(CHANGED, MIN_PROBLEMS - 1, 1000).startswith(UNDERPOWERED)
    assert sized_verdict(CHANGED, 1000, MIN_SAMPLES_PER_ARM - 1).startswith(UNDERPOWERED)


def _arm(label, texts, tokens, seconds, counters, logprob_sums=None):
    return em.ArmRun(
        label, texts, tokens, [["stop"] * len(r) for r in texts], seconds, counters, None, None, logprob_sums
    )


def _lp_arm(mean_logprob_per_problem, seed):
    """4 samples of 10 tokens per problem, token logprobs around the given per-problem mean."""
    rng = np.random.default_rng(seed)
    tokens = [[[1] * 10 for _ in range(4)] for _ in mean_logprob_per_problem]
    sums = [[float(10 * (mu + 0.3 * rng.standard_normal())) for _ in range(4)] for mu in mean_logprob_per_problem]
    return _arm("x", [["t"] * 4 for _ in tokens], tokens, 1.0, {}, sums)


def test_logprob_check_both_directions():
    mu = np.random.default_rng(9).uniform(-2.0, -0.5, 60)
    same = em.logprob_check(_lp_arm(mu, 101), _lp_arm(mu, 201), 0.05)  # (a 5% test: some seed pairs say changed)
    assert same["verdict"] == NO_CHANGE and same["ci"][0] < 0 < same["ci"][1]
    worse = em.logprob_check(_lp_arm(mu, 10), _lp_arm(mu - 0.5, 11), 0.05)
    assert worse["verdict"] == CHANGED and worse["difference"] == pytest.approx(-0.5, abs=0.1)
    assert em.logprob_check(_lp_arm(mu, 1), _arm("y", [], [], 1.0, {}), 0.05) is None  # not recorded


def test_report_and_plot(tmp_path):
    problems = [em.Problem("aime2024", str(i), "q", str(i)) for i in range(3)] + [em.Problem("gsm8k", "g", "q", "9")]
    off = _arm(
        "off",
        [["Answer: 0", "Answer: 1"], ["Answer: 1", "x"], ["Answer: 2", "Answer: 2"], ["Answer: 9"] * 2],
        [[[1, 2], [3]], [[4], [5]], [[6], [7]], [[8], [9]]],
        2.0,
        {},
        [[-2.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]],
    )
    on = _arm(
        "on",
        [["Answer: 0", "x"], ["Answer: 1", "x"], ["Answer: 2", "Answer: 2"], ["Answer: 9"] * 2],
        [[[1, 2], [0]], [[4], [5]], [[6], [7]], [[8], [9]]],
        1.0,
        {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 5},
        [[-2.0, -3.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]],
    )
    r = em.build_report(problems, off, on, builtin_score, 0.05)
    assert r["accuracy"]["all"]["off"]["pass_at_1"] == pytest.approx((0.5 + 0.5 + 1 + 1) / 4)
    assert r["accuracy"]["all"]["on"]["pass_at_1"] == pytest.approx((0.5 + 0.5 + 1 + 1) / 4)
    # 3 problems x 2 samples: too small for a verdict, and the report says so
    assert r["accuracy"]["aime2024"]["difference"]["verdict"].startswith(UNDERPOWERED + " (3 problems, 6 samples")
    assert r["accuracy"]["gsm8k"]["verdict"].startswith("n/a")  # one problem: no interval
    assert r["identical_samples_fraction"] == pytest.approx(7 / 8)
    assert r["speed"]["on"]["mean_acceptance_length"] == pytest.approx(1.5)
    assert r["speed"]["off"]["mean_acceptance_length"] is None
    assert r["speed"]["speedup"] == pytest.approx(2.0)
    lp = r["sampled_token_logprob"]  # per-sample mean: off problem 0 = (-1 - 1) / 2, on = (-1 - 3) / 2
    assert (lp["off"], lp["on"]) == (pytest.approx(-1.0), pytest.approx(-1.25))
    assert lp["verdict"].startswith(UNDERPOWERED)
    assert UNDERPOWERED in em.format_table(r) and "distribution check" in em.format_table(r)
    em.write_plot(r, tmp_path / "plot.png", "synthetic")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------------
# CLI errors: clear messages, before any engine starts
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "/no/such/model"], "no such folder"),
        (["--datasets", "gsm8k"], "give its file"),
        (["--datasets", "gsm8k", "--gsm8k", "/no/such/gsm8k.jsonl"], "dataset file not found"),
        (["--datasets", "gsm8k", "--gsm8k", "{empty}"], "no gsm8k problems"),
        (["--datasets", "gsm8k", "--gsm8k", "{one}"], "at least 2"),
    ],
)
def test_cli_errors(args, message, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "one.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    args = [a.format(empty=tmp_path / "empty.jsonl", one=tmp_path / "one.jsonl") for a in args]
    r = subprocess.run(
        [sys.executable, "-m", "evals.eval_math_cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]
