"""vLLM: the custom_class proposer, the model-runner patch it needs, and the CPU sampler guard."""
