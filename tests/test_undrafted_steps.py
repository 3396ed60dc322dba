"""sam_rollout.vllm.undrafted_steps: a step without drafts, handed to the plain sampler, gives the very
tokens and logprobs vLLM's own rejection sampler gives, with the CPU kernels bound as a worker binds them.

Both versions run on the same logits from the same random state (with the recovery noise compacted as
on a CPU platform, so both draw the same numbers), with per-request seeded generators and with the
global generator only, at T=1.0 and greedy, with and without logprobs. A step with drafts
must still go through vLLM's rejection sampler (the wrapper passes it on unchanged).
"""

from __future__ import annotations

import pytest
from conftest import require, require_module
from vllm_cpu_kernels import run_with_cpu_kernels

pytestmark = pytest.mark.engine  # vLLM's sampler code

require_module("vllm")

BATCH, VOCAB, SEEDS = 6, 300, 12

COMPARE = f"""
import json, torch
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from testkit.vllm_tools import sampling_metadata, spec_metadata
from sam_rollout.vllm import cpu_drafted_rows, cpu_sampler_fix
from sam_rollout.vllm.undrafted_steps import plain_sampling_without_drafts

# as the plugin does on a CPU platform: vLLM's expand kernel guarded, no recovery noise without drafts
cpu_sampler_fix.install()
cpu_drafted_rows.install()
batch, vocab = {BATCH}, {VOCAB}

def run(forward, drafts, greedy, seed, per_request, logprobs):
    rejection = RejectionSampler(Sampler())
    meta = spec_metadata(drafts)
    logits = 2 * torch.randn(int(meta.cu_num_sampled_tokens[-1]), vocab, generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(1000 + seed)
    generators = {{i: torch.Generator().manual_seed(100 * seed + i) for i in range(batch)}} if per_request else {{}}
    sampling = sampling_metadata(batch, greedy=greedy, generators=generators, logprobs=logprobs)
    out = forward(rejection, meta, None, logits, sampling)
    after = torch.rand(1).item()  # the global generator's state after the step
    lp = out.logprobs_tensors
    return {{
        "tokens": out.sampled_token_ids.tolist(),
        "logprobs": None if lp is None else [lp.logprob_token_ids.tolist(), lp.logprobs.tolist()],
        "after": after,
    }}

original = RejectionSampler.forward
patched = plain_sampling_without_drafts(original)
no_drafts = [[]] * batch
out = {{}}
for greedy in (False, True):
    for per_request in (True, False):
        for logprobs in (None, 0, 3):
            key = f"greedy={{greedy}} per_request={{per_request}} logprobs={{logprobs}}"
            out[key] = {{name: [run(fn, no_drafts, greedy, s, per_request, logprobs) for s in range({SEEDS})]
                        for name, fn in (("original", original), ("patched", patched))}}
with_drafts = [[5, 7], [], [9], [], [1, 2, 3], []]
out["with drafts"] = {{name: [run(fn, with_drafts, False, s, True, None) for s in range({SEEDS})]
                      for name, fn in (("original", original), ("patched", patched))}}
print("RESULT", json.dumps(out))
"""


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    ids_a, values_a = a
    ids_b, values_b = b
    flat_a = [x for row in values_a for x in row]
    flat_b = [x for row in values_b for x in row]
    return ids_a == ids_b and all(abs(x - y) <= 1e-5 * max(1.0, abs(x)) for x, y in zip(flat_a, flat_b, strict=True))


def test_undrafted_step_gives_the_rejection_samplers_tokens_and_logprobs(cpu_isa):
    from vllm.platforms import current_platform

    require(current_platform.is_cpu(), "needs vLLM's CPU platform (vllm-cpu)")
    out = run_with_cpu_kernels(COMPARE, isa=cpu_isa)
    for case, results in out.items():
        original, patched = results["original"], results["patched"]
        assert [r["tokens"] for r in patched] == [r["tokens"] for r in original], case
        assert [r["after"] for r in patched] == [r["after"] for r in original], case  # same draws
        assert all(_close(p["logprobs"], o["logprobs"]) for p, o in zip(patched, original, strict=True)), case
        if "greedy=False" in case or case == "with drafts":
            assert len({str(r["tokens"]) for r in original}) > 1, case  # the seeds matter: it can fail
    assert all(r["logprobs"] is not None for r in out["greedy=False per_request=True logprobs=3"]["patched"])
