"""The recipes' data rows (sam_rollout/verl/data/dapo.py): the DAPO instruction, and the easy arithmetic set
of the CPU preset, whose answers verl's math_dapo scorer (mirrored in evals.math_answers) accepts."""

from __future__ import annotations

import re

from conftest import require_module

from evals.math_answers import builtin_score
from sam_rollout.verl.data import dapo as dapo_data


def question_of(row: dict) -> str:
    text = row["prompt"][-1]["content"]
    assert text.startswith(dapo_data.INSTRUCTION_HEAD) and text.endswith(dapo_data.INSTRUCTION_TAIL)
    return text[len(dapo_data.INSTRUCTION_HEAD) : -len(dapo_data.INSTRUCTION_TAIL)]


def test_arithmetic_rows_hold_the_right_answers():
    rows = dapo_data.arithmetic_rows(500, seed=3, split="train")
    assert len(rows) == 500 and len({question_of(r) for r in rows}) > 100  # 81 sums and 81 products
    examples = rows[0]["prompt"][:-1]  # worked examples first, as earlier chat turns
    assert [m["role"] for m in examples] == ["user", "assistant"] * len(dapo_data.ARITHMETIC_EXAMPLES)
    assert all(builtin_score(m["content"], m["content"].rsplit(" ", 1)[1]).correct for m in examples[1::2])
    for i, row in enumerate(rows):
        a, op, b = re.fullmatch(r"What is (\d) (\+|\*) (\d)\?", question_of(row)).groups()
        expected = int(a) + int(b) if op == "+" else int(a) * int(b)
        truth = row["reward_model"]["ground_truth"]
        assert truth == str(expected) and int(truth) >= 0
        assert row["data_source"] == "math_dapo" and row["extra_info"] == {"index": i, "split": "train"}
        assert builtin_score(f"Let me add.\nAnswer: {truth}", truth).correct
        assert not builtin_score(f"Answer: {expected + 1}", truth).correct


def test_arithmetic_rows_are_reproducible_and_differ_by_seed():
    assert dapo_data.arithmetic_rows(50, 0, "train") == dapo_data.arithmetic_rows(50, 0, "train")
    assert dapo_data.arithmetic_rows(50, 0, "train") != dapo_data.arithmetic_rows(50, 1, "train")


def test_instruction_is_added_once():
    row = dapo_data.verl_row("What is 1 + 1?", 2, "math_dapo", "train", 0)
    again = dapo_data.verl_row(row["prompt"][0]["content"], 2, "math_dapo", "train", 0)
    assert again["prompt"] == row["prompt"]


def test_written_parquet_reads_back(tmp_path):
    pq = require_module("pyarrow.parquet")
    rows = dapo_data.arithmetic_rows(8, 0, "test")
    dapo_data.write_parquet(rows, tmp_path / "a.parquet")
    assert pq.read_table(tmp_path / "a.parquet").to_pylist() == rows
