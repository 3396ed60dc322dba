"""vllm-ascend: SAM through its n-gram route, and vectorised rejection-sampler fallbacks."""
