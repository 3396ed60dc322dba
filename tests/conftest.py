"""Shared test helpers.

`require(condition, reason)`: a missing prerequisite (model, engine, downloaded source) skips the
test, or the whole module when called at module level, except under SAM_STRICT=1 (set by
scripts/test.sh, so CI and the README's command), where it fails: there, everything is installed and a
skip would hide a broken set-up.

`require_module(name)`: a third-party module, imported, under the same rule. The project's own modules
(sam, rollout, testkit, evals, benchmarks) are imported plainly: a broken one must fail, never skip.
"""

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from testkit.cpu_isa import host_has_avx512

OWN_PACKAGES = ("sam", "rollout", "testkit", "evals", "benchmarks")

# vLLM's CPU kernels come in an AVX-512 and an AVX2 build; a host with AVX-512 tests both
CPU_ISAS = ["host", "avx2"] if host_has_avx512() else ["host"]


@pytest.fixture(params=CPU_ISAS)
def cpu_isa(request) -> str:
    """The CPU to run as: the host, and where it has AVX-512 also "avx2" (testkit.cpu_isa)."""
    return request.param


def strict() -> bool:
    return os.environ.get("SAM_STRICT") == "1"


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if strict():
        pytest.fail(f"prerequisite missing under SAM_STRICT=1: {reason}")
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str):
    """Import a third-party module, or skip (fail under SAM_STRICT=1) naming what is missing."""
    if name.split(".")[0] in OWN_PACKAGES:
        raise ValueError(f"{name} is the project's own module: import it plainly")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require(False, f"{name} is not importable: {e}")


def released_wheel(distribution: str, version: str) -> zipfile.ZipFile:
    """A released wheel, downloaded once with --no-deps and cached, for contract tests that read a vLLM
    this machine cannot install (tests/test_vllm023_contract.py, tests/test_vllm034_contract.py)."""
    cache = Path.home() / ".cache" / "sam-spec-rollout" / f"{distribution}-{version}"
    pattern = f"{distribution.replace('-', '_')}-*.whl"
    found = sorted(cache.glob(pattern))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
            + [f"{distribution}=={version}", "-d", str(cache)],
            capture_output=True,
            text=True,
        )
        found = sorted(cache.glob(pattern))
        require(bool(found), f"could not download {distribution}=={version}: {r.stderr.strip()[-300:]}")
    return zipfile.ZipFile(found[-1])
