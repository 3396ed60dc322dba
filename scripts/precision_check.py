"""Which dtypes are bit-exact between the decode path and the verify path? (testkit/precision.py)

python scripts/precision_check.py [--dtypes float32 bfloat16] [--prompts 4] [--max-tokens 128]

The code is ``testkit.precision_check``.
"""

from testkit.precision_check import main

if __name__ == "__main__":
    main()
