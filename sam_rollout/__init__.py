"""Adapters between the SAM drafter (``sam_rollout/drafter/``) and inference engines, one room per engine.

Engine-free core: ``settings`` (``additional_config.sam_spec``, validated once), ``stepper`` (one
drafting step over an engine's batch), ``metrics`` (the proposer's counters and per-step deltas).
Engines: ``vllm/`` (custom_class proposer, runner patch, CPU sampler guard), ``ascend/`` (vllm-ascend's
n-gram route), ``verl/`` (replica and server, metrics hook, recipe launcher). ``patches`` lists every
patch on vLLM, vllm-ascend and verl and applies them (docs/patches.md); ``plugin`` is the one place
that wires the engine rooms into a vLLM process; ``proposer`` keeps the
public path ``sam_rollout.proposer.SamProposer`` that users put in their configs.
"""
