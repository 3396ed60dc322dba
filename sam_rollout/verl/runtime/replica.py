"""SAM's vLLM server and replica for verl 0.9.1 (subclasses of verl's own; no fork).

- ``SamvLLMHttpServer._preprocess_engine_kwargs`` (verl's hook, called in ``launch_server`` before
  the engine arguments are built) checks SAM's settings before the engine starts and routes them
  to the platform: on GPU the route asked for (vLLM's ``custom_class`` proposer, vLLM 0.23 to 0.32, or
  the registered method ``sam``, vLLM >= 0.34; vLLM refuses the one it lacks, naming the other),
  vllm-ascend's ``ngram`` route with ``additional_config.sam_spec`` on NPU (vllm-ascend does not
  dispatch ``custom_class``; ``sam_rollout.ascend.ngram_route`` turns that route into SAM).
- ``SamvLLMHttpServer.sam_spec_metrics`` returns the proposer's counters from every worker
  (verl's own ``collective_rpc`` discards results); ``sam_save_prompt_store`` and
  ``sam_load_prompt_store`` move the prompt store to and from a file (``sam_rollout.verl.runtime.checkpoint``);
  ``sam_export_prompt_responses`` and ``sam_import_prompt_responses`` copy a few prompts' responses
  between two servers (``sam_rollout.verl.runtime.store_handoff``).
- ``SamvLLMHttpServer.generated_tokens`` counts the response tokens it generated, SAM on or off.
- ``SamvLLMReplica`` launches those servers and registers itself for per-step metrics
  (``sam_rollout.verl.runtime.tracking``).

Importing this module imports verl's vLLM rollout, hence vLLM.
"""

from __future__ import annotations

import ray
from verl.utils.device import get_device_name
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from sam_rollout.drafter.prompt_store import decode_entries
from sam_rollout.engine_kwargs import SETTINGS_KEY
from sam_rollout.verl.runtime import tracking
from sam_rollout.verl.runtime.engine_args import route_sam_engine_kwargs, sam_requested


class SamvLLMHttpServer(vLLMHttpServer):
    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        super()._preprocess_engine_kwargs(engine_kwargs)
        route_sam_engine_kwargs(engine_kwargs, get_device_name())

    async def sam_spec_metrics(self) -> list:
        """``SamMetrics.as_dict()`` per worker (None where no SAM proposer runs)."""
        return await self.engine.collective_rpc("sam_spec_metrics")

    async def generate(self, *args, **kwargs):
        output = await super().generate(*args, **kwargs)
        self._generated = getattr(self, "_generated", 0) + len(output.token_ids)
        return output

    async def generated_tokens(self) -> int:
        """Response tokens this server generated since it started (both arms: rollout time per token)."""
        return getattr(self, "_generated", 0)

    async def sam_save_prompt_store(self, path: str) -> list:
        """Per worker: what the engine's first worker wrote to `path` (or its error); None elsewhere."""
        return await self.engine.collective_rpc("sam_spec_save_prompt_store", args=(path,))

    async def sam_load_prompt_store(self, path: str) -> list:
        """Per worker: what its prompt store holds after loading `path`, and why it is empty if it is."""
        return await self.engine.collective_rpc("sam_spec_load_prompt_store", args=(path,))

    async def sam_export_prompt_responses(self, keys_hex: list[str]) -> dict:
        """The stored responses of these prompts (``encode_entries``' form) from the engine's first worker."""
        per_worker = await self.engine.collective_rpc("sam_spec_export_prompt_responses", args=(keys_hex,))
        return next((w for w in per_worker if w is not None), {})

    async def sam_import_prompt_responses(self, *exports: dict) -> dict:
        """Add the exports' responses to every worker's store (all workers stay alike: where one fails,
        every store is emptied, as after a partial load); returns the prompts received."""
        wire: dict[str, list[bytes]] = {}
        for export in exports:
            for key_hex, responses in export.items():
                wire.setdefault(key_hex, []).extend(responses)
        decode_entries(wire)  # a malformed entry is refused here, before any worker takes it
        if not wire:
            return {"prompts": 0, "new_responses": []}
        try:
            new = await self.engine.collective_rpc("sam_spec_import_prompt_responses", args=(wire,))
        except Exception:
            await self.sam_clear_prompt_store()
            raise
        return {"prompts": len(wire), "new_responses": new}

    async def sam_clear_prompt_store(self) -> list:
        """Per worker: whether its prompt store was emptied (after a partial load: all workers agree)."""
        return await self.engine.collective_rpc("sam_spec_clear_prompt_store")


class SamvLLMReplica(vLLMReplica):
    def __init__(self, replica_rank: int, config, model_config, *args, **kwargs):
        super().__init__(replica_rank, config, model_config, *args, **kwargs)
        self.server_class = ray.remote(SamvLLMHttpServer)
        engine_kwargs = (self.config.engine_kwargs or {}).get("vllm") or {}
        self.sam_enabled = sam_requested(engine_kwargs)
        self.sam_prompt_store = self.sam_enabled and prompt_store_requested(engine_kwargs)  # saved with checkpoints
        role = "reward" if self.is_reward_model else "teacher" if self.is_teacher_model else "rollout"
        self.sam_key = f"{role}_{self.replica_rank}{self.name_suffix}"
        tracking.track_replica(self)


def prompt_store_requested(engine_kwargs) -> bool:
    """``additional_config.sam_spec.prompt_store`` (checked with the other settings when the server starts)."""
    settings = (engine_kwargs.get("additional_config") or {}).get(SETTINGS_KEY) or {}
    return bool(settings.get("prompt_store", False))
