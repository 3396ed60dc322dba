"""Engine memory under one large GRPO group (benchmarks/group_memory.py): n siblings of one DAPO prompt.

    .venv/bin/python scripts/measure_group_memory.py [--siblings 256] [--tokens 2048] [--seconds 480]
        [--settings none ngram sam_group] [--kv-gib 4] [--json results/group_memory.json]

The code is ``benchmarks.measure_group_memory``.
"""

import sys

from benchmarks.measure_group_memory import main

if __name__ == "__main__":
    sys.exit(main())
