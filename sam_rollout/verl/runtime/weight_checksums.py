"""Evidence that verl's weight sync reached the rollout engine (``SAM_PATCH_WEIGHT_CHECKSUMS=1``).

Both ends log a float64 checksum of the same parameters on every sync, one line each on stderr (Ray
forwards worker output to the driver's log):

    SAM weight checksum sender global_steps=1 {"model.norm.weight": "1.038e+03", ..., "#tensors": 273}
    SAM weight checksum receiver {"model.norm.weight": "1.038e+03", ...}

- sender: verl's ``ServerAdapter.update_weights`` in the trainer worker, over the tensors as they stream;
- receiver: ``vLLMColocateWorkerExtension.update_weights_from_ipc`` in the vLLM worker, over the loaded model.
"""

from __future__ import annotations

import json
import sys

from sam_rollout.import_hooks import after_import

PREFIX = "SAM weight checksum"
# names as the HF actor streams them and as vLLM keeps them for Llama-like models (not fused, not tied)
WATCHED = ("model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.o_proj.weight", "model.norm.weight")
_MARK = "__sam_checksum_patched__"


def apply() -> None:
    after_import("verl.workers.rollout.vllm_rollout.vllm_rollout", checksum_sender)
    after_import("verl.workers.rollout.vllm_rollout.utils", checksum_receiver)


def _checksum(tensor) -> str:
    import torch

    return f"{tensor.detach().to(torch.float64).sum().item():.12e}"


def _report(side: str, fields: dict) -> None:
    print(f"{PREFIX} {side} {json.dumps(fields, sort_keys=True)}", file=sys.stderr, flush=True)


def parse(log_text: str) -> list[tuple[str, dict]]:
    """(side, fields) of every checksum line in a log, in order."""
    out = []
    for line in log_text.splitlines():
        at = line.find(PREFIX)
        if at >= 0:
            side, _, fields = line[at + len(PREFIX) :].strip().partition(" ")
            out.append((side, json.loads(fields)))
    return out


def checksum_sender() -> None:
    from verl.workers.rollout.vllm_rollout import vllm_rollout

    adapter = vllm_rollout.ServerAdapter
    if getattr(adapter.update_weights, _MARK, False):
        return
    original = adapter.update_weights

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        if wire_format != "named_tensors":
            return await original(self, weights, global_steps=global_steps, wire_format=wire_format, **kwargs)
        seen = {}

        def watch(named_tensors):
            count = 0
            for name, tensor in named_tensors:
                count += 1
                if name in WATCHED:
                    seen[name] = _checksum(tensor)
                yield name, tensor
            seen["#tensors"] = count

        result = await original(self, watch(weights), global_steps=global_steps, wire_format=wire_format, **kwargs)
        _report("sender", {"global_steps": global_steps, **seen})
        return result

    setattr(update_weights, _MARK, True)
    adapter.update_weights = update_weights


def checksum_receiver() -> None:
    from verl.workers.rollout.vllm_rollout import utils

    extension = utils.vLLMColocateWorkerExtension
    if getattr(extension.update_weights_from_ipc, _MARK, False):
        return
    original = extension.update_weights_from_ipc

    def update_weights_from_ipc(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        params = dict(self.model_runner.model.named_parameters())
        _report("receiver", {name: _checksum(params[name]) for name in WATCHED if name in params})
        return result

    setattr(update_weights_from_ipc, _MARK, True)
    extension.update_weights_from_ipc = update_weights_from_ipc
