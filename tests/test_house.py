"""The repository reads as a product, not a lab notebook: no Hydra run folders in the tree, every
result file under benchmarks/results/ cited by benchmarks/RESULTS.md (and every file it cites there),
a README that fits on a screen, a RESULTS.md that shows the current state, links that resolve, thin
scripts, and test support in testkit/ rather than benchmarks/."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
RESULTS_MD = REPO / "benchmarks" / "RESULTS.md"
README = REPO / "README.md"
README_MAX_LINES = 150
RESULTS_MAX_LINES = 600
ARTIFACT = re.compile(r"`([\w./-]+\.(?:json|jsonl|png|csv))`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_files() -> list[str]:
    """Paths git tracks, or, outside a git checkout (a copied tree), every file on disk."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".venv-verl", "__pycache__", ".pytest_cache", ".hypothesis"}
        return [
            str(p.relative_to(REPO))
            for p in REPO.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(REPO).parts)
        ]


def result_files() -> list[str]:
    prefix = "benchmarks/results/"
    return [p[len(prefix) :] for p in tracked_files() if p.startswith(prefix)]


def cites(text: str, path: str) -> bool:
    """A result file is cited by its name, or, inside a folder of results/, by the folder's name."""
    name = Path(path).name
    folder = Path(path).parts[0] if len(Path(path).parts) > 1 else name
    return name in text or folder in text


def github_anchor(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    return {github_anchor(m) for m in re.findall(r"^#+ (.+)$", markdown.read_text(), flags=re.M)}


def test_no_hydra_run_folders_are_tracked():
    hydra = [p for p in tracked_files() if p.startswith("outputs/") or "/.hydra/" in f"/{p}"]
    assert not hydra, f"Hydra run folders are committed (delete them; .gitignore has outputs/): {hydra[:5]}"


def test_every_result_file_is_cited_by_results_md():
    text = RESULTS_MD.read_text()
    uncited = [p for p in result_files() if not cites(text, p)]
    assert not uncited, (
        f"{len(uncited)} file(s) under benchmarks/results/ are not cited by benchmarks/RESULTS.md; "
        f"cite them in the section they belong to, or delete them (git keeps them): {uncited}"
    )


def test_every_result_file_results_md_cites_exists():
    files = set(result_files())
    names = {Path(p).name for p in files}
    missing = []
    for cited in set(ARTIFACT.findall(RESULTS_MD.read_text())):
        if cited.startswith("results/"):  # a script's default output folder (ignored by git), named as such
            continue
        if cited in files or cited in names or (REPO / cited).is_file():
            continue
        missing.append(cited)
    assert not missing, f"benchmarks/RESULTS.md cites result files that are not in the tree: {sorted(missing)}"


def test_the_cited_and_the_uncited_are_told_apart():
    text = "see `replay_qwen25math.json` and the step logs in `ab_cpu_2026-12-01/`"
    assert cites(text, "replay_qwen25math.json")
    assert cites(text, "ab_cpu_2026-12-01/summary.txt")
    assert not cites(text, "replay_speed.json")
    assert not cites(text, "revisit_cpu_2026-12-01/prompt_store_on.jsonl")


def test_readme_fits_one_screen_and_keeps_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; details go to docs/"
    commands = [line.strip() for line in lines if line.startswith("    bash scripts/")]
    assert commands[:2] == ["bash scripts/demo.sh", "bash scripts/test.sh"], commands


def test_results_md_is_the_current_state():
    text = RESULTS_MD.read_text()
    n = len(text.splitlines())
    assert n <= RESULTS_MAX_LINES, f"benchmarks/RESULTS.md has {n} lines; history lives in git"
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    diary = [h for h in headings if re.search(r"\bstop\b|20\d\d-\d\d-\d\d", h)]
    assert not diary, f"stop-by-stop or dated headings (keep one section per benchmark): {diary}"


@pytest.mark.parametrize("doc", ["README.md", "docs/usage.md", "docs/settings.md", "benchmarks/RESULTS.md"])
def test_relative_links_resolve(doc):
    source = REPO / doc
    broken = []
    for target in LINK.findall(source.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (source.parent / path).resolve() if path else source
        missing_anchor = bool(anchor) and dest.suffix == ".md" and dest.exists() and anchor not in anchors(dest)
        if not dest.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{doc}: links that do not resolve: {broken}"


def test_scripts_are_shell_entry_points_only():
    """A Python tool runs as ``python -m benchmarks.X`` (or testkit, evals) from the checkout: one file, no
    trampoline in scripts/. scripts/ keeps the shell entry points users and CI run."""
    assert sorted(p.name for p in (REPO / "scripts").iterdir() if p.suffix not in (".sh", ".txt")) == []


def files_under_tests() -> list[Path]:
    return sorted(p for p in (REPO / "tests").rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def test_test_support_lives_in_testkit_not_in_benchmarks():
    """The rule: conftest.py and the tests' helper modules (files under tests/ not named test_*) import
    nothing from benchmarks/ or evals/; and a test file imports from benchmarks/ only the benchmark it
    tests, named in its file name or docstring. Support the tests share goes to testkit/."""
    helpers, strays = [], []
    for path in files_under_tests():
        modules = imported_modules(path)
        ours = sorted(m for m in modules if m.split(".")[0] in ("benchmarks", "evals"))
        if not path.name.startswith("test_"):
            helpers += [f"{path.relative_to(REPO)} imports {m}" for m in ours]
            continue
        benchmarks = {m.split(".")[1] for m in modules if m.startswith("benchmarks.")}
        named = f"{path.stem} {ast.get_docstring(ast.parse(path.read_text())) or ''}"
        if benchmarks and not any(b in named for b in benchmarks):
            strays.append(f"{path.relative_to(REPO)} imports {sorted(benchmarks)} but tests none of them")
    assert not helpers, (
        f"shared test helpers reach into benchmarks/ or evals/; move that support to testkit/: {helpers}"
    )
    assert not strays, f"test support in benchmarks/ (move it to testkit/): {strays}"


def test_every_tool_with_a_main_runs_as_a_module():
    """``python -m benchmarks.X`` (or evals, testkit, sam_rollout) runs ``main`` only behind the guard; a module
    with a ``main`` and no guard would exit 0 having done nothing."""
    missing = []
    for package in ("benchmarks", "evals", "testkit", "sam_rollout"):
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
            if has_main and not any(is_main_guard(n) for n in tree.body):
                missing.append(str(path.relative_to(REPO)))
    assert missing == [], f"a main() without `if __name__ == '__main__':` calling it: {missing}"


def is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` whose body calls ``main()`` (or ``sys.exit(main())``)."""
    if not (isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"):
        return False
    return any("main(" in ast.unparse(statement) for statement in node.body)
