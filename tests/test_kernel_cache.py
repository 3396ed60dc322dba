"""numba's cached drafter kernels follow an edit in another drafter module (sam_rollout.drafter.kernel_cache).

A copy of the package is run in fresh processes: `draft._best_in` is compiled and cached, then
`token_log.continuation_length`, which numba compiles into it, is edited in the copy. numba alone
would load the cached `_best_in` (draft.py did not change) and return the old result.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (states, log, v, length, k, longer_than): state 1 (length 3) has its first occurrence at log
# position 0, followed by two tokens, then an empty slot.
BEST_IN = """
import json
import numpy as np
from sam_rollout.drafter import draft
from sam_rollout.drafter.layout import S_LEN, S_REP, STATE_WIDTH
states = np.zeros(2 * STATE_WIDTH, np.int32)
states[STATE_WIDTH + S_LEN] = 3
states[STATE_WIDTH + S_REP] = 0
log = np.full(8, -1, np.int32)
log[:3] = (7, 8, 9)
print(json.dumps({"found": list(draft._best_in(states, log, 1, 3, 5, 0)),
                  "cache_hits": sum(draft._best_in.stats.cache_hits.values())}))
"""
HELPER = "def continuation_length(log, pos, k):\n    n = 0\n"
EDITED = "def continuation_length(log, pos, k):\n    n = 4\n"  # counts from 4: two followers give 5 (k)


def run_best_in(root: Path, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", BEST_IN], env=env, cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("location", ["NUMBA_CACHE_DIR", "__pycache__"])
def test_cached_kernel_follows_an_edit_in_another_module(tmp_path, location):
    package = tmp_path / "sam_rollout"
    shutil.copytree(REPO / "sam_rollout", package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = str(tmp_path)
    if location == "NUMBA_CACHE_DIR":
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "cache")
        cache_root = tmp_path / "cache"
    else:
        cache_root = package / "drafter" / "__pycache__"

    assert run_best_in(tmp_path, env) == {"found": [3, 0, 2], "cache_hits": 0}
    index = [p for p in cache_root.rglob("draft._best_in-*.nbi")]
    assert len(index) == 1  # cached where numba's locator puts it
    assert (index[0].parent / "kernel-sources.sha256").exists()
    assert run_best_in(tmp_path, env) == {"found": [3, 0, 2], "cache_hits": 1}  # kept while nothing changed

    token_log = package / "drafter" / "token_log.py"
    source = token_log.read_text()
    assert source.count(HELPER) == 1, "the edited helper moved: update HELPER"
    token_log.write_text(source.replace(HELPER, EDITED))
    assert run_best_in(tmp_path, env) == {"found": [3, 0, 5], "cache_hits": 0}
