"""SAM drafter: dynamic suffix automata for model-free speculative decoding. No vLLM or verl here."""

from .automaton import SuffixAutomaton
from .config import DraftConfig
from .drafter import SOURCE_GROUP, SOURCE_HISTORY, SOURCE_NONE, BatchDrafter, Proposal

__all__ = [
    "BatchDrafter",
    "DraftConfig",
    "Proposal",
    "SuffixAutomaton",
    "SOURCE_NONE",
    "SOURCE_GROUP",
    "SOURCE_HISTORY",
]
