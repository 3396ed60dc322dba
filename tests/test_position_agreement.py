"""The tally of benchmarks/position_agreement.py: who is right, split by SAM's match length."""

import numpy as np

from benchmarks.position_agreement import tally


def test_tally_splits_positions_by_who_is_right_and_match_length():
    hits = np.array(
        [
            (1, 1, 1),  # both, match 1
            (1, 0, 2),  # SAM only, match 2
            (0, 1, 12),  # Arctic only, match 12
            (0, 1, 40),  # Arctic only, match 40
            (0, 0, 0),  # neither, no match
        ]
    )
    counts = tally(hits)
    assert counts["all"] == {"positions": 5, "both": 1, "sam_only": 1, "arctic_only": 2}
    assert counts["sam match 2-2"] == {"positions": 1, "both": 0, "sam_only": 1, "arctic_only": 0}
    assert counts["sam match 9-16"]["arctic_only"] == 1
    assert counts["sam match 17-more"]["arctic_only"] == 1
    assert sum(v["positions"] for k, v in counts.items() if k != "all") == 4  # match 0 is in no bin
