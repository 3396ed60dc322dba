"""Write the recipes' data as verl parquet files (sam_rollout/verl/data/dapo.py says what is in them).

    python -m sam_rollout.verl.data.prepare [--out ~/data/dapo] [--source local|hub] [--shared ../shared/data]

Writes dapo-math-17k.parquet and aime-2024.parquet (the 32B and 235B recipes), and
arithmetic-train.parquet and arithmetic-val.parquet (the SmolLM2 CPU preset).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sam_rollout.verl.data import dapo as data

ARITHMETIC_TRAIN_ROWS, ARITHMETIC_VAL_ROWS = 1024, 64


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("~/data/dapo").expanduser())
    p.add_argument("--source", choices=("local", "hub"), default="local")
    p.add_argument("--shared", type=Path, default=data.default_shared(), help="shared data folder (local source)")
    p.add_argument(
        "--limit",
        type=int,
        default=0,
        help="keep only the first N training rows, arithmetic too (smoke runs, revisits)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the arithmetic set")
    p.add_argument("--arithmetic-only", action="store_true", help="only the CPU preset's set (no shared data needed)")
    args = p.parse_args(argv)
    write_arithmetic(args)
    if args.arithmetic_only:
        return 0
    try:
        train, val = data.read_local(args.shared) if args.source == "local" else data.read_hub()
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = data.train_rows(train)
    if args.limit:
        rows = rows[: args.limit]
    data.write_parquet(rows, args.out / data.TRAIN_NAME)
    data.write_parquet(data.val_rows(val), args.out / data.VAL_NAME)
    return 0


def write_arithmetic(args) -> None:
    train = data.arithmetic_rows(args.limit or ARITHMETIC_TRAIN_ROWS, args.seed, "train")
    val = data.arithmetic_rows(ARITHMETIC_VAL_ROWS, args.seed + 1, "test")
    data.write_parquet(train, args.out / data.ARITHMETIC_TRAIN_NAME)
    data.write_parquet(val, args.out / data.ARITHMETIC_VAL_NAME)


if __name__ == "__main__":
    sys.exit(main())
