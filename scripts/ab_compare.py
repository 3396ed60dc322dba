"""Compare a baseline run and a SAM run from verl's file-logger JSONL (one {"step", "data"} per line).

    python scripts/ab_compare.py BASELINE.jsonl SAM.jsonl [--plots DIR] [--tolerance 0.05]

The code is ``evals.ab_compare``.
"""

import sys

from evals.ab_compare import main

if __name__ == "__main__":
    sys.exit(main())
