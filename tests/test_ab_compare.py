"""evals/ab_compare.py on synthetic verl file-logger logs: known speed-up, agreeing curves, a known
difference, and bad input."""

import json

import numpy as np
import pytest

from evals import ab_compare as ab


def ar1(rng, n, sd, rho=0.5):
    e = np.zeros(n)
    for t in range(1, n):
        e[t] = rho * e[t - 1] + rng.normal(0, sd)
    return e


def write_log(path, rng, steps, reward_shift=0.0, gen_scale=1.0, sam=False, tokens=None):
    """One verl file-logger JSONL: {"step": s, "data": {...}} per training step, plus a validation line."""
    t = np.arange(steps)
    reward = -0.6 + 0.8 * t / steps + reward_shift + ar1(rng, steps, 0.03)
    length = 2000 + 3000 * t / steps + ar1(rng, steps, 60)
    gen = gen_scale * (300 + 2 * t)  # exact, so the speed-up is known
    with open(path, "w") as f:
        f.write(json.dumps({"step": 0, "data": {"val-core/aime-2024/acc/mean@1": 0.1}}) + "\n")
        for s in range(steps):
            data = {
                "timing_s/gen": float(gen[s]),
                "train/num_gen_batches": 1,
                "critic/score/mean": float(reward[s]),
                "response_length/mean": float(length[s]),
            }
            if tokens is not None:  # both arms' generation counters (rollout/generated_tokens, rollout/requests)
                data |= {"rollout/generated_tokens": float(tokens), "rollout/requests": 16.0}
            if sam:
                data.update(
                    {
                        "rollout/sam_acceptance_length": 1.8,
                        "rollout/sam_spec_on_fraction": 0.3,
                        "rollout/sam_drafter_ms": 0.2,
                    }
                )
            f.write(json.dumps({"step": s + 1, "data": data}) + "\n")


def run(tmp_path, steps=60, reward_shift=0.0, seed=0):
    rng = np.random.default_rng(seed)
    base, sam = tmp_path / "base.jsonl", tmp_path / "sam.jsonl"
    write_log(base, rng, steps)
    write_log(sam, rng, steps, reward_shift=reward_shift, gen_scale=0.9, sam=True)
    return ab.compare(base, sam, tolerance=0.05, plots=tmp_path / "plots")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_training_curves_agree(tmp_path, seed):
    lines, verdicts = run(tmp_path, seed=seed)
    assert [v.label for v in verdicts] == ["agree", "agree"], "\n".join(lines)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_known_reward_difference_is_found(tmp_path, seed):
    lines, verdicts = run(tmp_path, reward_shift=0.1, seed=seed)
    by_key = {v.key: v for v in verdicts}
    assert by_key[ab.REWARD].label == "differ", "\n".join(lines)
    assert 0.07 < by_key[ab.REWARD].mean_difference < 0.13
    assert by_key[ab.RESPONSE_LENGTH].label == "agree"


def test_few_steps_are_inconclusive(tmp_path):
    _, verdicts = run(tmp_path, steps=4, reward_shift=0.1)
    assert [v.label for v in verdicts] == ["inconclusive", "inconclusive"]


def test_an_inconclusive_run_states_the_steps_a_verdict_needs():
    v = ab.Verdict("r", mean_difference=0.0, low=-0.2, high=0.2, margin=0.1, steps=12)
    assert v.label == "inconclusive" and v.steps_for_a_verdict == 48  # half-width 2x the room: 4x the steps
    assert ab.Verdict("r", 0.15, 0.05, 0.25, 0.1, 12).steps_for_a_verdict == 0  # the mean is past the margin


def test_rollout_time_per_generated_token(tmp_path):
    rng = np.random.default_rng(0)
    base, sam = tmp_path / "base.jsonl", tmp_path / "sam.jsonl"
    write_log(base, rng, 12, tokens=1000)
    write_log(sam, rng, 12, gen_scale=0.9, sam=True, tokens=1200)  # more tokens in less time
    text = "\n".join(ab.compare(base, sam, tolerance=0.05, plots=None)[0])
    assert "speed-up 1.333x" in text and "requests per step: baseline 16.0, SAM 16.0" in text


def test_speedup_acceptance_and_plots(tmp_path):
    lines, _ = run(tmp_path)
    text = "\n".join(lines)
    assert "speed-up 1.111x" in text  # SAM's rollout time is 0.9 x the baseline's
    assert "change -10.0%" in text
    assert "mean acceptance length (SAM): 1.800" in text
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == sorted(
        ["timing_s_gen.png", "critic_score_mean.png", "response_length_mean.png", "rollout_sam_acceptance_length.png"]
    )
    assert all((tmp_path / "plots" / p).read_bytes().startswith(b"\x89PNG") for p in pngs)


def test_exit_status_and_bad_input(tmp_path, capsys):
    rng = np.random.default_rng(0)
    base, sam = tmp_path / "base.jsonl", tmp_path / "sam.jsonl"
    write_log(base, rng, 60)
    write_log(sam, rng, 60, gen_scale=0.9, sam=True)
    assert ab.main([str(base), str(sam)]) == 0
    write_log(sam, rng, 60, reward_shift=0.1, sam=True)
    assert ab.main([str(base), str(sam)]) == 1
    (tmp_path / "bad.jsonl").write_text("not json\n")
    assert ab.main([str(base), str(tmp_path / "bad.jsonl")]) == 2
    assert "not a verl file-logger record" in capsys.readouterr().err
