"""SAM on vs off at fixed weights in the CPU preset's engine (run in .venv-verl): response lengths and
token distributions compared with two-sample tests, at a stated power (evals/fixed_weight_lossless.py).

    .venv-verl/bin/python scripts/fixed_weight_lossless.py --rounds 30 --json FILE
"""

import sys

from evals.fixed_weight_lossless import main

if __name__ == "__main__":
    sys.exit(main())
