"""SAM drafter: dynamic suffix automata for model-free speculative decoding. No vLLM or verl here."""

from .batch import SOURCE_GROUP, SOURCE_HISTORY, SOURCE_NONE, SOURCE_STORE, BatchDrafter, Proposal
from .config import DraftConfig
from .prompt_store import PromptStore
from .single_stream import SuffixAutomaton

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
