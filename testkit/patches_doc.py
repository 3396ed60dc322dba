"""The patch table in docs/patches.md, rendered from the registry (``sam_rollout.patches.PATCHES``).

    python -m testkit.patches_doc           # rewrite the table in docs/patches.md
    python -m testkit.patches_doc --check   # exit 1 if the committed table is not the rendering

The registry holds every column but ``why``, prose with links into the docs: that cell is kept from the
committed table, row by row. A new patch gets the placeholder ``NO_WHY``, which tests/test_patches.py
rejects until it is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sam_rollout.patches import ALL_PLATFORMS, PATCHES, Patch

DOC = Path(__file__).resolve().parents[1] / "docs" / "patches.md"
COLUMNS = ("patch", "target", "why", "versions", "platforms", "switch", "module")
HEADER = "| " + " | ".join(COLUMNS) + " |"
NO_WHY = "(why it is needed: write it here)"
COMMAND = "python -m testkit.patches_doc"


def switch_cell(patch: Patch) -> str:
    return f"`{patch.env}=0`" if patch.default_on else f"`{patch.env}=1` (opt-in)"


def platforms_cell(patch: Patch) -> str:
    return "all" if patch.platforms == ALL_PLATFORMS else ", ".join(sorted(patch.platforms))


def module_path(patch: Patch) -> str:
    """The file of the patch's install function, relative to the repository root."""
    return patch.install.partition(":")[0].replace(".", "/") + ".py"


def row(patch: Patch, why: str) -> str:
    cells = (
        f"`{patch.name}`",
        f"`{patch.target}`",
        why,
        f"{patch.engine} {patch.versions}",
        platforms_cell(patch),
        switch_cell(patch),
        f"`{module_path(patch)}`",
    )
    return "| " + " | ".join(cells) + " |"


def _table_span(lines: list[str]) -> tuple[int, int]:
    """[first, end) of the table's lines: its header, the rule, its rows."""
    try:
        first = lines.index(HEADER)
    except ValueError:
        raise ValueError(f"{DOC.name} has no patch table (a line {HEADER!r})") from None
    end = first + 1
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return first, end


def table_cells(text: str) -> dict[str, dict[str, str]]:
    """{patch name: {column: cell}} of the table in ``text``, as committed."""
    lines = text.splitlines()
    first, end = _table_span(lines)
    rows = {}
    for line in lines[first + 2 : end]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != len(COLUMNS):
            raise ValueError(f"a table row has {len(cells)} cells, not {len(COLUMNS)}: {line[:80]}")
        cell = dict(zip(COLUMNS, cells, strict=True))
        rows[cell["patch"].strip("`")] = cell
    return rows


def render(text: str) -> str:
    """``text`` (docs/patches.md) with its table rendered from the registry, each ``why`` kept."""
    whys = {name: cell["why"] for name, cell in table_cells(text).items()}
    lines = text.splitlines()
    first, end = _table_span(lines)
    table = [HEADER, "|" + "---|" * len(COLUMNS)] + [row(p, whys.get(p.name, NO_WHY)) for p in PATCHES]
    return "\n".join(lines[:first] + table + lines[end:]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/patches.md is not the rendering")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    rendered = render(text)
    if args.check:
        if rendered != text:
            print(f"{DOC} differs from the registry's rendering; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(rendered)
    missing = [name for name, cell in table_cells(rendered).items() if cell["why"] == NO_WHY]
    print(f"wrote {DOC}" + (f"; write the why of: {', '.join(missing)}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
