"""Store handoff: copy a prompt's stored responses to the replica its next visit goes to.

The router (``sam_rollout.verl.runtime.router``) places a returning group on the replica holding its
prompt's stored responses while that replica stays within the load bound. When the bound sends the
group elsewhere, ``RayStoreHandoff`` copies the prompt's responses from the replicas that hold them to
the chosen one, before the group's first request leaves the router: the new engine drafts from them
as the old one would have, so balance no longer costs the store (docs/metrics.md, "the load bound").

The copy goes server to server through Ray (``SamvLLMHttpServer.sam_export_prompt_responses`` into
``sam_import_prompt_responses``; the router only waits for the answer), a few hundred KB per prompt.
A failure never stops routing: the group runs without its store there, and the router counts it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

# the router waits at most this long for a copy: both servers answer between two engine steps
HANDOFF_TIMEOUT_S = 30.0


class RayStoreHandoff:
    """``handoff(key, sources, target)`` copies the prompt ``key``'s responses from the servers
    ``sources`` (Ray actor handles of SamvLLMHttpServer) to ``target``; returns whether they arrived.
    A server class without the methods (a replica without SAM) turns handoffs off for the run."""

    def __init__(self, timeout_s: float = HANDOFF_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.unsupported: str | None = None  # why handoffs are off, once a server lacked the methods

    def __call__(self, key: bytes, sources: Sequence[Any], target: Any) -> bool:
        if self.unsupported is not None or not sources:
            return False
        import ray

        try:
            exports = [source.sam_export_prompt_responses.remote([key.hex()]) for source in sources]
            # Ray passes each export's result to the import: the responses go server to server
            received = ray.get(target.sam_import_prompt_responses.remote(*exports), timeout=self.timeout_s)
        except AttributeError as e:
            self.unsupported = f"the rollout servers cannot hand off prompt stores ({e}); stores stay where they are"
            logger.warning("[sam] %s", self.unsupported)
            return False
        except Exception as e:  # a server gone, a timeout, an engine error: route on without the store
            logger.warning("[sam] prompt store handoff of %s failed: %s: %s", key.hex(), type(e).__name__, e)
            return False
        return bool(received.get("prompts"))  # 0: the sources no longer held it (evicted)
