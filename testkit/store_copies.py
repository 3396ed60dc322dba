"""A store handoff for the router without engines (``SamLoadBalancer(..., handoff=StoreCopies())``): each copy
is a record that says it arrived. The routing benchmark and the router's tests read from it where each
prompt's store went."""

from __future__ import annotations


class StoreCopies:
    """Records (prompt key, source handles, target handle) per copy; every copy arrives."""

    def __init__(self) -> None:
        self.copies: list[tuple[bytes, list, object]] = []

    def __call__(self, key, sources, target) -> bool:
        self.copies.append((key, list(sources), target))
        return True
