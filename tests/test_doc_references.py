"""Every repo path that the code, tests, notes and docs cite must exist in the repo.

The scanner looks for repo-relative paths (``docs/...``, ``benchmarks/...``, ``tilegym/...``,
``tests/...``, ``.ci/...`` with a file extension or a trailing slash, and the root design page) and
skips what is not a path of this repo: URLs and absolute paths (a ``/`` before the match),
globs (``*``) and templates (``<suite>``, ``{name}``, ``$VAR``). It also rejects any mention
of the folder beside the checkout that does not travel with the project.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = frozenset({".py", ".md", ".cuh", ".sh", ".toml", ".cfg", ".txt"})
TEXT_NAMES = frozenset({"Makefile"})
TEXT_FOLDERS = frozenset({".ci"})  # extensionless scripts (.ci/run)
SKIP_DIRS = frozenset({".git", ".venv", "build", "dist", ".cache", "__pycache__", ".pytest_cache", ".ruff_cache"})

# A candidate starts at a known top-level name not preceded by a path or word character
# (so URLs, absolute paths and $OUT/... do not match) and runs over path-ish characters.
_CANDIDATE_RE = re.compile(r"(?<![\w./$-])((?:docs|benchmarks|tilegym|tests|\.ci)/[\w./<>*{}$+@-]*|DESIGN\.md)")
_TEMPLATE_CHARS = frozenset("<>*{}$")
_HAS_EXTENSION_RE = re.compile(r"\.[A-Za-z0-9]+$")
# Spelled in pieces (like the broken examples below) so this file passes its own checks.
FORBIDDEN_MENTIONS = ("../" + "shared", "/work/" + "shared")


def cited_paths(text: str) -> list[tuple[int, str]]:
    """(line number, path) of every repo-relative path cited in ``text``, templates and globs skipped."""
    found = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for match in _CANDIDATE_RE.finditer(line):
            path = match.group(1).rstrip(".")  # a sentence's full stop is not part of the path
            if _TEMPLATE_CHARS.intersection(path):
                continue
            if path.endswith("/") or _HAS_EXTENSION_RE.search(path.rsplit("/", 1)[-1]):
                found.append((lineno, path))
    return found


def missing_paths(text: str, root: Path) -> list[tuple[int, str]]:
    """The cited paths of ``text`` that do not exist under ``root`` (a trailing slash needs a folder)."""
    missing = []
    for lineno, path in cited_paths(text):
        target = root / path
        exists = target.is_dir() if path.endswith("/") else target.exists()
        if not exists:
            missing.append((lineno, path))
    return missing


def forbidden_mentions(text: str) -> list[tuple[int, str]]:
    """(line number, mention) of every reference to files outside the repo that do not travel with it."""
    return [
        (lineno, mention)
        for lineno, line in enumerate(text.splitlines(), start=1)
        for mention in FORBIDDEN_MENTIONS
        if mention in line
    ]


def _is_text_file(rel: Path) -> bool:
    return rel.suffix in TEXT_SUFFIXES or rel.name in TEXT_NAMES or (rel.parts[0] in TEXT_FOLDERS and not rel.suffix)


def repo_files(root: Path = REPO) -> list[Path]:
    """Repo-relative paths of the project's files: git's list when available, else a filtered walk."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            check=True,
            text=True,
        ).stdout
        return sorted({Path(p) for p in listed.split("\0") if p and (root / p).is_file()})
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        files.extend(Path(folder, n).relative_to(root) for n in names)
    return sorted(files)


def _read_texts(root: Path, files: Iterable[Path]) -> Iterable[tuple[Path, str]]:
    for rel in files:
        try:
            yield rel, (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):  # binary files (plots) hold no references
            continue


def _report(problems: list[str], what: str) -> str:
    return f"{len(problems)} {what}:\n" + "\n".join(f"  {p}" for p in problems)


# --- the scanner itself --------------------------------------------------------------------


def test_scanner_catches_a_broken_reference_and_ignores_non_paths(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("x")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    gone, old_design = "docs" + "/gone.md", "DESIGN" + ".md"
    text = "\n".join(
        [
            "See docs/design.md and benchmarks/results/.",  # exist
            f"Broken: `{gone}`, and {old_design}.",  # do not exist
            "https://github.com/org/repo/blob/main/docs/url.md",  # URL
            "docs/*.md, benchmarks/results/<suite>/, tests/{name}.py",  # glob, templates
            "$OUT/docs/out.md and /tmp/tests/x.py and tilegym/ops",  # not repo paths / no extension
        ]
    )
    assert missing_paths(text, tmp_path) == [(2, gone), (2, old_design)]
    assert cited_paths(text)[:2] == [(1, "docs/design.md"), (1, "benchmarks/results/")]


def test_scanner_reads_paths_inside_markdown_links_and_python_strings() -> None:
    text = '[page](docs/design.md#anchor) and path = "tilegym/ops/__init__.py"'
    assert cited_paths(text) == [(1, "docs/design.md"), (1, "tilegym/ops/__init__.py")]


def test_forbidden_mentions_are_caught() -> None:
    outside = FORBIDDEN_MENTIONS[0] + "/docs/x.md"
    assert forbidden_mentions(f"ok\nsee {outside}\n") == [(2, FORBIDDEN_MENTIONS[0])]
    assert forbidden_mentions("docs/design.md") == []


def test_repo_files_lists_this_file() -> None:
    assert Path("tests/test_doc_references.py") in repo_files()


# --- the repository ------------------------------------------------------------------------


def test_every_cited_repo_path_exists() -> None:
    texts = _read_texts(REPO, [f for f in repo_files() if _is_text_file(f)])
    problems = [f"{rel}:{lineno}: {path}" for rel, text in texts for lineno, path in missing_paths(text, REPO)]
    if problems:
        pytest.fail(_report(problems, "cited paths that do not exist in the repo"))


def test_nothing_cites_files_outside_the_repo() -> None:
    texts = _read_texts(REPO, repo_files())
    problems = [f"{rel}:{lineno}: {mention}" for rel, text in texts for lineno, mention in forbidden_mentions(text)]
    if problems:
        pytest.fail(_report(problems, "mentions of files outside the repo (they do not travel with it)"))
