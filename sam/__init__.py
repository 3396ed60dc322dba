"""SAM drafter: dynamic suffix automata for model-free speculative decoding. No vLLM or verl here."""

from .automaton import SuffixAutomaton
from .config import DraftConfig
from .drafter import SOURCE_GROUP, SOURCE_HISTORY, SOURCE_NONE, SOURCE_STORE, BatchDrafter, Proposal
from .prompt_store import PromptStore

__all__ = [
    "BatchDrafter",
    "DraftConfig",
    "PromptStore",
    "Proposal",
    "SuffixAutomaton",
    "SOURCE_NONE",
    "SOURCE_GROUP",
    "SOURCE_HISTORY",
    "SOURCE_STORE",
]
