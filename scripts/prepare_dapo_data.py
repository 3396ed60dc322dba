"""Write the recipes' data as verl parquet files (rollout/verl/dapo_data.py says what is in them).

    python scripts/prepare_dapo_data.py [--out ~/data/dapo] [--source local|hub] [--shared ../shared/data]

The code is ``rollout.verl.prepare_dapo_data``.
"""

import sys

from rollout.verl.prepare_dapo_data import main

if __name__ == "__main__":
    sys.exit(main())
