"""Final-answer scoring for math problems: verl's DAPO scorer when verl imports, a mirror of it otherwise.

verl's ``verl.utils.reward_score.math_dapo.compute_score`` (the scorer of the DAPO recipe, and verl's
choice for ``aime*`` data sources) looks only at the last 300 characters of a response:

1. ``Answer: ...`` (case-insensitive, the last such line) is normalised (Minerva rules: units, TeX
   wrappers, ``$``, thousands separators, the text after the last ``=``) and compared with the
   normalised ground truth;
2. when there is no ``Answer:`` line, the last ``\\boxed{...}`` (nested braces allowed) in the last
   100 of those characters is compared with the ground truth **as written** (verl 0.9.1 does not
   normalise this path).

``BUILTIN`` below mirrors verl 0.9.1's behaviour (its normalisation tables follow the
lm-evaluation-harness Hendrycks-MATH rules that verl adapted; Apache-2.0); tests compare the two on
the same strings when verl is importable.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

INVALID = "[INVALID]"  # verl's pred when no "Answer:" line is found
TAIL_CHARS = 300  # verl scores only the end of a response
BOX_TAIL_CHARS = 100  # ... and looks for \boxed{} only at its very end
ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

_SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]
_REMOVED = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
]
# (pattern, replacement) applied in order after the plain substitutions
_TEX_REWRITES = [
    (r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"),  # keep only the first $...$ span
    (r"(\\text\{)(.*?)(\})", "\\2"),
    (r"(\\textbf\{)(.*?)(\})", "\\2"),
    (r"(\\overline\{)(.*?)(\})", "\\2"),
    (r"(\\boxed\{)(.*)(\})", "\\2"),
    (r"(frac)([^{])(.)", "frac{\\2}{\\3}"),  # \frac12 -> \frac{1}{2}
    (r"(sqrt)([^{])", "sqrt{\\2}"),  # \sqrt2 -> \sqrt{2}
]


@dataclass(frozen=True)
class Score:
    correct: bool
    pred: str | None  # the extracted answer (normalised on the Answer: path); INVALID when none found
    via: str  # "answer_line", "boxed" or "none"


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, braces balanced; None when there is none or it never closes."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len("\\boxed{") : i]
    return None


def normalize_final_answer(answer: str) -> str:
    """Minerva-style normalisation, as verl's math_dapo applies it to both sides of the Answer: path."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _REMOVED:
        answer = answer.replace(expr, "")
    for pattern, repl in _TEX_REWRITES:
        answer = re.sub(pattern, repl, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def builtin_score(response: str, ground_truth: str) -> Score:
    """verl 0.9.1 math_dapo.compute_score, re-implemented (see the module docstring)."""
    tail = response[-TAIL_CHARS:]
    lines = ANSWER_LINE.findall(tail)
    if lines:
        pred = normalize_final_answer(lines[-1])
        return Score(pred == normalize_final_answer(ground_truth), pred, "answer_line")
    boxed = last_boxed(tail[-BOX_TAIL_CHARS:])
    if boxed is not None:
        return Score(boxed == ground_truth, boxed, "boxed")
    return Score(False, INVALID, "none")


def _verl_math_dapo():
    try:
        from verl.utils.reward_score import math_dapo
    except Exception:  # not installed, or installed without what its package __init__ imports
        return None
    return math_dapo


def _verl_scorer(math_dapo) -> Callable[[str, str], Score]:
    def score(response: str, ground_truth: str) -> Score:
        r = math_dapo.compute_score(response, ground_truth)
        pred = r.get("pred")
        if pred == INVALID:
            via = "none"
        else:  # verl does not say which path matched; its Answer: path wins whenever a line exists
            via = "answer_line" if ANSWER_LINE.search(response[-TAIL_CHARS:]) else "boxed"
        return Score(bool(r["acc"]), pred, via)

    return score


def get_scorer(which: str = "auto") -> tuple[str, Callable[[str, str], Score]]:
    """("verl <version> math_dapo" | "builtin mirror of verl 0.9.1 math_dapo", score function).

    which: "auto" (verl when importable), "verl" (error when it is not) or "builtin"."""
    if which not in ("auto", "verl", "builtin"):
        raise ValueError(f"scorer must be auto, verl or builtin, got {which!r}")
    if which != "builtin":
        math_dapo = _verl_math_dapo()
        if math_dapo is not None:
            import verl

            return f"verl {getattr(verl, '__version__', '?')} math_dapo.compute_score", _verl_scorer(math_dapo)
        if which == "verl":
            raise RuntimeError("--scorer verl: verl.utils.reward_score.math_dapo is not importable")
    return "builtin mirror of verl 0.9.1 math_dapo.compute_score", builtin_score
