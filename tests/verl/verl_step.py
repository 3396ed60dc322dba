"""Gate for tests/verl: they run in the verl environment (.venv-verl, scripts/test_verl.sh) with
SAM_VERL_TESTS=1, in their own CI step. The main suite (.venv, no verl) skips these modules whole,
before importing verl; under SAM_VERL_TESTS=1 and SAM_STRICT=1 a missing verl fails."""

import importlib.util
import os

import pytest
from conftest import require

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def verl_step_only() -> None:
    if os.environ.get("SAM_VERL_TESTS") != "1":
        pytest.skip("verl tests run in their own step: bash scripts/test_verl.sh", allow_module_level=True)
    require(importlib.util.find_spec("verl") is not None, "verl is not installed (bash scripts/setup_verl_env.sh)")


SHARED = os.path.join(os.environ.get("SAM_SHARED_DIR", os.path.join(os.path.dirname(REPO), "shared")), "data")
QWEN3_32B_CONFIG = {  # the fields a dry run reads from the model's config.json (Qwen3-32B's values)
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "max_position_embeddings": 40960,
}


def make_inputs(root):
    """A model directory with a config.json (no weights: nothing is launched) and the DAPO parquet
    files prepared from the shared data by python -m sam_rollout.verl.data.prepare."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(root)
    model = root / "Qwen3-32B"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(QWEN3_32B_CONFIG))
    require(os.path.isdir(os.path.join(SHARED, "problems")), f"shared data not found at {SHARED}")
    data = root / "data"
    cmd = [
        sys.executable,
        "-m",
        "sam_rollout.verl.data.prepare",
        "--out",
        str(data),
        "--shared",
        SHARED,
        "--limit",
        "64",
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    return model, data
