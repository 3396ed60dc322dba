"""Is a sampled run reproducible from the engine seed? Each setting twice, same everything.

    python scripts/check_sampled_reproducibility.py [--settings none ngram sam] [--runs 2]

The code is ``testkit.check_sampled_reproducibility``.
"""

from testkit.check_sampled_reproducibility import main

if __name__ == "__main__":
    main()
