"""SAM drafter: dynamic suffix automata for model-free speculative decoding. No vLLM or verl here.

`batch` (BatchDrafter: requests, groups, history; one compiled call per batch) drives the compiled
kernels: `layout` (the array fields, fresh arrays), `edges` (edge blocks), `token_log`, `build`
(extending the automata, counts) and `draft` (the drafting policies). `single_stream` is one stream
(SuffixAutomaton), `config` the settings, `prompt_store` the responses kept per prompt, `pages` huge-page
arrays; `switch` (schedules) and `auto_switch` (the online switch) decide k per step.

numba's on-disk cache checks only the file a kernel is defined in, while the kernels it calls from
the other modules are compiled into it: `kernel_cache` drops the cached kernels at import whenever a
drafter source or numba's version has changed.
"""

from .kernel_cache import drop_stale_drafter_kernels

drop_stale_drafter_kernels()  # before the kernel modules load

from .batch import SOURCE_GROUP, SOURCE_HISTORY, SOURCE_NONE, SOURCE_STORE, BatchDrafter, Proposal  # noqa: E402
from .config import DraftConfig  # noqa: E402
from .prompt_store import PromptStore  # noqa: E402
from .single_stream import SuffixAutomaton  # noqa: E402

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
