"""SAM drafter: dynamic suffix automata for model-free speculative decoding. No vLLM or verl here.

`batch` (BatchDrafter: requests, groups, history; one compiled call per batch) drives the compiled
kernels: `layout` (the array fields, fresh arrays), `edges` (edge blocks), `token_log`, `build`
(extending the automata, counts) and `draft` (the drafting policies). `single_stream` is one stream
(SuffixAutomaton), `config` the settings, `prompt_store` the responses kept per prompt, `pages` huge-page
arrays; `switch` (schedules) and `auto_switch` (the online switch) decide k per step.

numba's on-disk cache checks only the file a kernel is defined in, while the kernels it calls from
the other compiled modules are compiled into it: after editing one of them, clear the `__pycache__`
folders (or use a fresh NUMBA_CACHE_DIR).
"""

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
