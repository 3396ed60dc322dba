"""Shared test helpers.

`require(condition, reason)`: a missing prerequisite (model, engine, downloaded source) skips the
test, except under SAM_STRICT=1 (set by scripts/test.sh, so CI and the README's command), where it
fails: there, everything is installed and a skip would hide a broken set-up.
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `from conftest import require` in test modules


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if os.environ.get("SAM_STRICT") == "1":
        pytest.fail(f"prerequisite missing under SAM_STRICT=1: {reason}")
    pytest.skip(reason)
