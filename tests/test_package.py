"""The wheel users install holds one top-level package, ``sam_rollout``, with its entry points; tooling
(benchmarks, evals, testkit) stays in the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_one_top_level_package(tmp_path):
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("sam_spec_rollout-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"sam_rollout"}
    assert "sam_rollout/drafter/__init__.py" in names and "sam_rollout/verl/runtime/router.py" in names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "sam_spec_rollout = sam_rollout.plugin:register" in text
    assert "sam_spec_rollout = sam_rollout.verl.plugin" in text
