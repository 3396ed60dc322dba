"""Shapes of the models the cost models and profilers stand for, from their public Hugging Face configs.

Keys: layers, hidden, heads (query), kv_heads, head_dim, vocab; dense: intermediate; MoE: experts,
top_k (experts per token), moe_intermediate (one expert's width).
"""

from __future__ import annotations

# Qwen/Qwen3-32B config.json
QWEN3_32B = dict(layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600, vocab=151936)

# Qwen/Qwen3-235B-A22B config.json
QWEN3_235B_A22B = dict(
    layers=94,
    hidden=4096,
    heads=64,
    kv_heads=4,
    head_dim=128,
    experts=128,
    top_k=8,
    moe_intermediate=1536,
    vocab=151936,
)
