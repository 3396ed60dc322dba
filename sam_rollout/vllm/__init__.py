"""vLLM: the custom_class proposer, the model-runner patch it needs, plain sampling for steps without
drafts, and the CPU sampler guards."""
