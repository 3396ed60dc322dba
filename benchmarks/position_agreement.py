"""Where SAM and Arctic suffix decoding are right: the first draft token at every position of a trace set.

    python -m benchmarks.position_agreement [--traces qwen25math | FILE.npz] [--k 3]

Not lockstep: every sibling of a group advances one token per step, and at every position both drafters
(SAM with the default settings and a 2M-token history; Arctic with vLLM's defaults) propose k tokens from
the same text. Counts of positions where both, only one or neither has the right first token, split by
the length of SAM's matched suffix: it shows where one drafter's way of choosing a continuation wins.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from sam_rollout.drafter import DraftConfig

from .drafters import ArcticSuffixDrafter, SamDrafter
from .policy_split import HISTORY_TOKENS, SMOLLM2
from .traces import load_trace_set

MATCH_BINS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 1 << 30))


def first_token_hits(groups, k: int) -> np.ndarray:
    """Per position: (SAM right, Arctic right, SAM's match length); positions where SAM has no draft
    count as not right for it."""
    sam = SamDrafter("default", DraftConfig(history_tokens=HISTORY_TOKENS))
    arctic = ArcticSuffixDrafter()
    rows = []
    for g, group in enumerate(groups):
        ids = [f"{g}/{i}" for i in range(len(group.responses))]
        texts = [np.concatenate([group.prompt, r]) for r in group.responses]
        lengths = [len(r) for r in group.responses]
        for req, n in zip(ids, lengths):
            for drafter in (sam, arctic):
                drafter.start(req, group.prompt, str(g))
                if n == 0:
                    drafter.finish(req)
        active = [i for i, n in enumerate(lengths) if n > 0]
        pos = 0
        while active:
            step = [group.responses[i][pos : pos + 1] for i in active]
            for drafter in (sam, arctic):
                drafter.extend([ids[i] for i in active], step)
            pos += 1
            for i in [i for i in active if pos >= lengths[i]]:
                for drafter in (sam, arctic):
                    drafter.finish(ids[i])
            active = [i for i in active if pos < lengths[i]]
            if not active:
                break
            req_ids = [ids[i] for i in active]
            proposal = sam.drafter.propose(req_ids, k)  # the batch API: drafts with their match lengths
            arctic_drafts = arctic.propose(req_ids, [texts[i][: len(group.prompt) + pos] for i in active], k)
            for row, (i, draft) in enumerate(zip(active, arctic_drafts)):
                truth = int(group.responses[i][pos])
                sam_right = proposal.lengths[row] > 0 and int(proposal.tokens[row, 0]) == truth
                arctic_right = len(draft) > 0 and int(draft[0]) == truth
                rows.append((sam_right, arctic_right, int(proposal.match_lengths[row])))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def tally(hits: np.ndarray) -> dict:
    sam, arctic, match = hits[:, 0] > 0, hits[:, 1] > 0, hits[:, 2]

    def counts(sel):
        return {
            "positions": int(sel.sum()),
            "both": int((sam & arctic & sel).sum()),
            "sam_only": int((sam & ~arctic & sel).sum()),
            "arctic_only": int((~sam & arctic & sel).sum()),
        }

    out = {"all": counts(np.ones_like(sam))}
    for lo, hi in MATCH_BINS:
        out[f"sam match {lo}-{hi if hi < 1 << 30 else 'more'}"] = counts((match >= lo) & (match <= hi))
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=SMOLLM2, help="'qwen25math' (shared traces) or a trace file (.npz)")
    parser.add_argument("--k", type=int, default=3)
    args = parser.parse_args(argv)
    name, groups = load_trace_set(args.traces)
    result = {"traces": name, "k": args.k, "counts": tally(first_token_hits(groups, args.k))}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
