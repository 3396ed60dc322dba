"""evals.math_answers mirrors verl's math_dapo scorer (used when verl is not installed): the two
agree on known cases and on 5,000 random strings built from answer-like fragments."""

import random

from verl_step import verl_step_only

verl_step_only()

from test_eval_math import KNOWN  # noqa: E402

from evals.math_answers import builtin_score, get_scorer  # noqa: E402


def _random_responses(count: int, seed: int):
    frags = [
        "Answer:",
        "answer :",
        "\\boxed{",
        "}",
        "{",
        "$",
        "=",
        "1",
        "2",
        ",",
        "\\frac",
        "12",
        " ",
        "\n",
        "\\text{cm}",
        "x",
        "\\sqrt",
        "3",
        ".",
        "^\\circ",
    ]
    rng = random.Random(seed)
    for _ in range(count):
        yield (
            "".join(rng.choice(frags) for _ in range(rng.randint(0, 40))),
            "".join(rng.choice(frags[6:]) for _ in range(rng.randint(1, 4))),
        )


def test_builtin_scorer_matches_verl():
    """verl's math_dapo and the mirror agree on every string."""
    name, verl_score = get_scorer("verl")
    assert name.startswith("verl ")
    cases = [(r, t) for r, t, *_ in KNOWN] + list(_random_responses(5000, 0))
    for response, truth in cases:
        a, b = builtin_score(response, truth), verl_score(response, truth)
        assert (a.correct, a.pred, a.via) == (b.correct, b.pred, b.via), (response, truth)
