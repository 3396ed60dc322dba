"""The recipes' data in verl's parquet format, with the DAPO "Answer:" instruction.

- DAPO-Math-17k (train) and AIME-2024 (validation), from the repository's shared copies
  (``<shared>/problems/dapo-math-17k.parquet``, verl format with bare problems, and
  ``<shared>/problems/aime-2024.jsonl``) or from the hub (BytedTsinghua-SIA/DAPO-Math-17k and
  BytedTsinghua-SIA/AIME-2024 through ``datasets``).
- An easy arithmetic set (train and validation) for the CPU preset: a 135M model scores about 0 on
  DAPO-Math-17k, so DAPO's group filter would drop every group; on this set it gets some answers right.

Each row: data_source ("math_dapo" for training, "aime-2024" for validation; verl scores both with
``verl.utils.reward_score.math_dapo``, which reads the last "Answer: ..." line), prompt (one user
message: the DAPO instruction around the problem), ability, reward_model.ground_truth, extra_info.
The instruction is added only where it is missing, so official rows pass through unchanged.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

INSTRUCTION_HEAD = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
INSTRUCTION_TAIL = '\n\nRemember to put your answer on its own line after "Answer:".'
# the shared AIME copy asks for \boxed{}; DAPO's reward reads "Answer:" instead
BOXED_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."

TRAIN_NAME = "dapo-math-17k.parquet"
VAL_NAME = "aime-2024.parquet"
HUB_TRAIN = "BytedTsinghua-SIA/DAPO-Math-17k"
HUB_VAL = "BytedTsinghua-SIA/AIME-2024"


def dapo_prompt(problem: str) -> str:
    if problem.startswith(INSTRUCTION_HEAD):
        return problem
    problem = problem.strip()
    if problem.endswith(BOXED_SUFFIX):
        problem = problem[: -len(BOXED_SUFFIX)].rstrip()
    return INSTRUCTION_HEAD + problem + INSTRUCTION_TAIL


def verl_row(problem: str, answer, data_source: str, split: str, index: int) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": dapo_prompt(problem)}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index, "split": split},
    }


def train_rows(records) -> list[dict]:
    """verl-format records (bare or official) -> DAPO training rows."""
    out = []
    for i, r in enumerate(records):
        problem = r["prompt"][-1]["content"]
        out.append(verl_row(problem, r["reward_model"]["ground_truth"], "math_dapo", "train", i))
    return out


def val_rows(records) -> list[dict]:
    """{"prompt"/"problem", "answer"} records -> DAPO validation rows."""
    out = []
    for i, r in enumerate(records):
        problem = r.get("problem") or r["prompt"]
        if isinstance(problem, list):  # already chat-formatted (official AIME-2024)
            problem = problem[-1]["content"]
        answer = r.get("answer")
        if answer is None:
            answer = r["reward_model"]["ground_truth"]
        out.append(verl_row(problem, answer, "aime-2024", "test", i))
    return out


def read_local(shared: Path) -> tuple[list, list]:
    import pyarrow.parquet as pq

    train_path, val_path = shared / "problems" / "dapo-math-17k.parquet", shared / "problems" / "aime-2024.jsonl"
    for p in (train_path, val_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found (use --shared DIR or --source hub)")
    train = pq.read_table(train_path).to_pylist()
    val = [json.loads(line) for line in val_path.read_text().splitlines() if line.strip()]
    return train, val


def read_hub() -> tuple[list, list]:
    from datasets import load_dataset

    return list(load_dataset(HUB_TRAIN, split="train")), list(load_dataset(HUB_VAL, split="train"))


def write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    print(f"wrote {len(rows)} rows to {path}")


def default_shared() -> Path:
    """../shared/data beside the repository, or $SAM_SHARED_DIR/data (as testkit/data.py reads it)."""
    root = os.environ.get("SAM_SHARED_DIR")
    return Path(root) / "data" if root else Path(__file__).resolve().parents[4] / "shared" / "data"


# ---------------------------------------------------------------------------------------------
# Easy arithmetic: a set a 135M model gets partly right, so DAPO's group filter keeps some groups
# ---------------------------------------------------------------------------------------------

ARITHMETIC_TRAIN_NAME = "arithmetic-train.parquet"
ARITHMETIC_VAL_NAME = "arithmetic-val.parquet"


# Worked examples as earlier chat turns: a 135M model copies the "Answer:" line from them (asked bare,
# it answered 0 of 64 questions in the format math_dapo reads).
ARITHMETIC_EXAMPLES = (
    ("What is 2 + 2?", "2 + 2 = 4\nAnswer: 4"),
    ("What is 3 * 3?", "3 * 3 = 9\nAnswer: 9"),
    ("What is 5 + 1?", "5 + 1 = 6\nAnswer: 6"),
)


def arithmetic_problem(rng: random.Random) -> tuple[str, int]:
    """A sum or a product of two digits, and its value."""
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if rng.random() < 2 / 3:
        return f"What is {a} + {b}?", a + b
    return f"What is {a} * {b}?", a * b


def arithmetic_rows(count: int, seed: int, split: str) -> list[dict]:
    """``count`` easy arithmetic rows in the DAPO format (data_source math_dapo: verl's math_dapo scorer),
    each prompt preceded by the worked examples."""
    rng = random.Random(seed)
    examples = []
    for question, answer in ARITHMETIC_EXAMPLES:
        examples += [{"role": "user", "content": dapo_prompt(question)}, {"role": "assistant", "content": answer}]
    rows = []
    for i in range(count):
        row = verl_row(*arithmetic_problem(rng), "math_dapo", split, i)
        row["prompt"] = examples + row["prompt"]
        rows.append(row)
    return rows
