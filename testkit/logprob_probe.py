"""What a V1-runner vLLM worker sampled, step by step: for each request row, its drafts, the tokens the
step emitted and each token's log-softmax recomputed from the logits the sampler was given.

``install`` wraps the worker's ``model_runner._sample`` (vLLM 0.23-0.32, the custom_class route; the
rejection sampler is called from there), ``collect`` returns and clears what was recorded, ``uninstall``
puts the runner's own method back. Both run in the
worker through ``collective_rpc`` (a callable: ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). Benchmark and test
support only: a probe costs a float64 log-softmax over the step's logits.

A record per request row and step: ``req_id`` (the engine's id: the client's id plus ``-`` and a suffix),
``drafts`` (the row's draft tokens this step, scheduled and verified), ``step_drafted`` (whether any row
of the step had drafts), ``tokens`` (what the sampler emitted: accepted drafts, then the recovered or
bonus token), ``reference`` and ``reference64`` (log-softmax of each token's logits row in float32, as
vLLM's sampler computes it, and in float64; from the logits before sampling touched them: raw logits, so
the engine's processed log-probs equal them only at temperature 1 without top-k/top-p) and ``discarded``
(a partial prefill's token, which the engine drops).
"""

from __future__ import annotations

import types

ATTR = "_sam_logprob_probe"


def _rows(metadata, num_reqs: int) -> list[list[int]]:
    """Logits rows of each request: its draft positions, then its bonus position."""
    if metadata is None:
        return [[i] for i in range(num_reqs)]
    target, bonus = metadata.target_logits_indices.tolist(), metadata.bonus_logits_indices.tolist()
    rows, start = [], 0
    for i, d in enumerate(metadata.num_draft_tokens):
        rows.append(target[start : start + d] + [bonus[i]])
        start += d
    return rows


def _drafts(metadata, num_reqs: int) -> list[list[int]]:
    if metadata is None:
        return [[] for _ in range(num_reqs)]
    flat, out, start = metadata.draft_token_ids.tolist(), [], 0
    for d in metadata.num_draft_tokens:
        out.append(flat[start : start + d])
        start += d
    return out


def _recording(sample, runner, records: list):
    import torch

    def probed_sample(self, logits, spec_decode_metadata):
        num_reqs = self.input_batch.num_reqs
        req_ids = list(self.input_batch.req_ids[:num_reqs])
        discarded = self.discard_request_mask.np[:num_reqs].tolist()
        rows = _rows(spec_decode_metadata, num_reqs)
        drafts = _drafts(spec_decode_metadata, num_reqs)
        # before the sampler edits logits in place
        reference = logits.log_softmax(dim=-1, dtype=torch.float32)
        reference64 = logits.to(torch.float64).log_softmax(dim=-1)
        probs = reference64.exp()
        out = sample(logits, spec_decode_metadata)
        emitted = out.sampled_token_ids.tolist()
        step_drafted = any(drafts)
        vocab = logits.shape[-1]
        for i, rid in enumerate(req_ids):
            tokens = [t for t in emitted[i] if 0 <= t < vocab]  # placeholders (-1) mark rejected slots
            records.append({
                "req_id": rid,
                "drafts": drafts[i],
                "step_drafted": step_drafted,
                "tokens": tokens,
                "reference": [float(reference[rows[i][j], t]) for j, t in enumerate(tokens)],
                "reference64": [float(reference64[rows[i][j], t]) for j, t in enumerate(tokens)],
                # the probability of the tokens likelier than it, in its row: a sampled token's randomised
                # PIT, above + U x p(token), is uniform on [0, 1] (sampler checks)
                "mass_above": [float(probs[rows[i][j]][probs[rows[i][j]] > probs[rows[i][j], t]].sum())
                               for j, t in enumerate(tokens)],  # fmt: skip
                "discarded": bool(discarded[i]),
            })  # fmt: skip
        return out

    return types.MethodType(probed_sample, runner)


def install(worker) -> bool:
    """Record every sampling step of this worker from now on; False if already recording."""
    runner = worker.model_runner
    if hasattr(runner, ATTR):
        return False
    records: list = []
    setattr(runner, ATTR, records)
    runner._sample = _recording(runner._sample, runner, records)
    return True


def uninstall(worker) -> bool:
    """Stop recording; False if this worker was not recording."""
    runner = worker.model_runner
    if not hasattr(runner, ATTR):
        return False
    delattr(runner, ATTR)
    del runner._sample  # the instance attribute: the class's method shows again
    return True


def collect(worker) -> list[dict]:
    """The records since the last collect (cleared here)."""
    records = getattr(worker.model_runner, ATTR)
    out = list(records)
    records.clear()
    return out
