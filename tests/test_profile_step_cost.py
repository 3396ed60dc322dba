"""benchmarks/profile_step_cost.py: GQA-packed attention computes what per-head attention computes, with and
without the causal mask among the q new tokens, and the tiny CPU sweep prices the whole q grid."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from benchmarks.profile_step_cost import QS, main, packed_gqa_attention


def per_head_attention(queries, keys, values, masked: bool) -> torch.Tensor:
    """Textbook attention, one query head and one new token at a time, in float64."""
    batch, q, heads, head_dim = queries.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    out = torch.zeros(batch, q, heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        for head in range(heads):
            k, v = keys[b, head // group].double(), values[b, head // group].double()
            for position in range(q):
                visible = length - q + position + 1 if masked else length
                scores = k[:visible] @ queries[b, position, head].double() / math.sqrt(head_dim)
                out[b, position, head] = scores.softmax(0) @ v[:visible]
    return out.reshape(batch, q, heads * head_dim)


@pytest.mark.parametrize("masked", [True, False], ids=["causal", "unmasked"])
@pytest.mark.parametrize(("q", "heads", "kv_heads"), [(1, 8, 2), (3, 8, 2), (5, 4, 4), (17, 6, 3)])
def test_packed_attention_equals_per_head_attention(masked: bool, q: int, heads: int, kv_heads: int) -> None:
    generator = torch.Generator().manual_seed(q * 100 + heads)
    batch, length, head_dim = 2, 23 + q, 8
    queries = torch.randn(batch, q, heads, head_dim, generator=generator)
    keys = torch.randn(batch, kv_heads, length, head_dim, generator=generator)
    values = torch.randn(batch, kv_heads, length, head_dim, generator=generator)
    packed = packed_gqa_attention(queries, keys, values, masked)
    torch.testing.assert_close(packed.double(), per_head_attention(queries, keys, values, masked), atol=1e-5, rtol=1e-5)


def test_the_mask_matters_when_q_is_above_one() -> None:
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(1, 3, 4, 8, generator=generator)
    keys, values = (torch.randn(1, 2, 10, 8, generator=generator) for _ in "kv")
    assert not torch.allclose(
        packed_gqa_attention(queries, keys, values, True), packed_gqa_attention(queries, keys, values, False)
    )


@pytest.mark.parametrize("model", ["dense", "moe"])
def test_tiny_cpu_sweep_prices_the_q_grid(tmp_path, model: str) -> None:
    out = tmp_path / "cost.csv"
    main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--model",
            model,
            "--layers",
            "1",
            "--batches",
            "1,2",
            "--contexts",
            "64",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--masked",
            "--out",
            str(out),
        ]
    )
    rows = list(csv.DictReader(out.open()))
    assert QS == "1,2,3,5,9,17"
    assert sorted({int(row["q"]) for row in rows}) == [1, 2, 3, 5, 9, 17]
    assert all(row["masked"] == "1" for row in rows)
