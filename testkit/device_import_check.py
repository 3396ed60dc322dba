"""Imports the modules a vLLM engine run of the device checks loads, each on its own, and prints ok or FAIL.

Run on the lent machine before any engine starts (scripts/device_lease.sh's ``import`` piece): a wheel left
out of the pack or a file pruned from it (testkit/device_pack.py) shows here in seconds rather than as an
engine failing after a minute of start-up. Here, without a GPU, only ``vllm.platforms.cuda`` may fail (it
needs libcuda). Exit status: 1 if any import failed.
"""

from __future__ import annotations

import importlib
import sys

MODULES = (
    # the engine, its worker and attention backends
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.v1.engine.core",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.flex_attention",
    # the models, drafting, sampling
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.qwen3",
    "vllm.v1.spec_decode.ngram_proposer",
    "vllm.v1.spec_decode.eagle",
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.rejection_sampler",
    "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.v1.structured_output",
    # loading, executors, compilation, kernels
    "vllm.model_executor.model_loader",
    "vllm.model_executor.model_loader.dummy_loader",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.tokenizers",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    "vllm.compilation.backends",
    "vllm.compilation.cuda_graph",
    "vllm.model_executor.layers.fused_moe",
    "vllm.model_executor.kernels.linear",
    "vllm.platforms.cuda",
    # this project and the checks
    "sam_rollout.plugin",
    "sam_rollout.vllm.proposer",
    "testkit.engine",
    "testkit.engine_cost",
    "testkit.tiny_model",
    "benchmarks.gpu_engine_checks",
    "benchmarks.bench_rejection",
    "benchmarks.profile_vllm_cpu",
    "gguf",
)


def main() -> int:
    failed = 0
    for module in MODULES:
        try:
            importlib.import_module(module)
            print("ok  ", module)
        except BaseException as e:  # a failed import may raise anything, SystemExit included
            failed += 1
            print("FAIL", module, type(e).__name__, str(e)[:300])
    print(f"{len(MODULES) - failed} of {len(MODULES)} imported")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
