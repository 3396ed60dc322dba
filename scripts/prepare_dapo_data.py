"""DAPO-Math-17k (train) and AIME-2024 (validation) as verl parquet files with the DAPO instruction.

    python scripts/prepare_dapo_data.py [--out ~/data/dapo] [--source local|hub] [--shared ../shared/data]

local (default when the files are there): the repository's shared copies,
  <shared>/problems/dapo-math-17k.parquet (verl format, bare problems) and
  <shared>/problems/aime-2024.jsonl ({"prompt": ..., "answer": ...}).
hub: the official datasets (BytedTsinghua-SIA/DAPO-Math-17k and BytedTsinghua-SIA/AIME-2024) through
  the `datasets` package; needs network access to the hub.

Each row: data_source ("math_dapo" for training, "aime-2024" for validation; both are scored by
verl.utils.reward_score.math_dapo, which reads the last "Answer: ..." line), prompt (one user
message: the DAPO instruction around the problem), ability, reward_model.ground_truth, extra_info.
The instruction is added only where it is missing, so official rows pass through unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
    """../shared/data beside the repository, or $SAM_SHARED_DIR/data (as benchmarks/data.py reads it)."""
    root = os.environ.get("SAM_SHARED_DIR")
    return Path(root) / "data" if root else Path(__file__).resolve().parents[2] / "shared" / "data"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("~/data/dapo").expanduser())
    p.add_argument("--source", choices=("local", "hub"), default="local")
    p.add_argument("--shared", type=Path, default=default_shared(), help="shared data folder (local source)")
    p.add_argument("--limit", type=int, default=0, help="keep only the first N training rows (smoke runs)")
    args = p.parse_args(argv)
    try:
        train, val = read_local(args.shared) if args.source == "local" else read_hub()
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = train_rows(train)
    if args.limit:
        rows = rows[: args.limit]
    write_parquet(rows, args.out / TRAIN_NAME)
    write_parquet(val_rows(val), args.out / VAL_NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
