"""scripts/device_checks.sh, the accelerator checks in one script: its CPU tiny mode writes every result
file, and without a GPU its real mode refuses at once with a clear message."""

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


def run(*args):
    env = dict(os.environ, PYTHON=sys.executable)
    script = str(REPO / "scripts" / "device_checks.sh")
    return subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=600, env=env)


def test_tiny_mode_writes_every_result(tmp_path):
    r = run(str(tmp_path), "--tiny")
    assert r.returncode == 0, r.stderr[-3000:]
    bench = json.loads((tmp_path / "bench_rejection.json").read_text())
    assert bench["device"] == "cpu" and bench["rows"][0]["batch_size"] == 2
    for name, layers in (("step_cost_dense.csv", 64), ("step_cost_moe_tp4.csv", 94)):
        rows = list(csv.DictReader((tmp_path / name).open()))
        assert len(rows) == 4 and all(float(row[f"ms_per_step_{layers}_layers"]) > 0 for row in rows)
    route = json.loads((tmp_path / "vllm_route.json").read_text())
    from rollout.vllm import routes

    assert route["routes"] == sorted(routes.available_routes()) and route["engine"] == "skipped: no --model"


def test_real_mode_needs_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the real mode runs instead of refusing")
    r = run(str(tmp_path))
    assert r.returncode != 0 and "no CUDA device: use --tiny on a CPU" in r.stderr
    assert run(str(tmp_path), "--fast").returncode == 2
