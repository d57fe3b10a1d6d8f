"""The front door stays a front door: the README short, every config key documented, no
text pointing to notes outside the repository or naming the work item a change came from,
and an architecture document that is the design, not a diary."""

import dataclasses
import pathlib
import re
import subprocess

from amptrain.config.sections import Config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def config_keys():
    """Every key of the sections every task has, and of each built-in task's own."""
    from amptrain import registry

    keys = ["task"]
    sections = [(s.name, s.type) for s in dataclasses.fields(Config) if dataclasses.is_dataclass(s.type)]
    for name in registry.known():
        sections += list(registry.task_class(name).config_sections.items())
    for name, section in sections:
        keys += [f"{name}.{key.name}" for key in dataclasses.fields(section) if f"{name}.{key.name}" not in keys]
    return keys


def test_every_config_key_is_in_the_configuration_reference():
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert [key for key in config_keys() if f"`{key}`" not in reference] == []


def test_the_readme_is_at_most_150_lines():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150


def test_no_text_points_to_notes_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    phrase = "issue" + " note"  # not spelt out: this file would find itself
    offending = [
        path
        for path in tracked
        if path.endswith((".md", ".py", ".toml")) and phrase in (ROOT / path).read_text(encoding="utf-8")
    ]
    assert offending == []


# "issue N", "session N", "issues N-M", "#N" (N a number): the project speaks of itself only. An
# upstream bug is cited with its repository ("keras-team/keras#21207"), which is allowed.
WORK_ITEM = re.compile(r"(?i)\b(issues?|sessions?|work items?|tickets?)[ -]?#?\d+|(?<![\w&/.-])#\d+\b")
PROJECT_TEXT = ("README.md", "docs/", "src/", "tests/", "examples/", "benchmarks/", "scripts/", "configs/")


def work_item_mentions(paths):
    found = []
    for path in paths:
        for number, line in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1):
            cleaned = re.sub(r"[\w.-]+/[\w.-]+#\d+", "", line)  # owner/repo#N: an upstream citation
            if WORK_ITEM.search(cleaned):
                found.append(f"{path}:{number}: {line.strip()}")
    return found


def test_no_line_names_a_past_work_item_by_number():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    texts = [p for p in tracked if p.startswith(PROJECT_TEXT) and p.endswith((".md", ".py", ".toml"))]
    assert work_item_mentions(texts) == []


def test_a_planted_work_item_is_found(tmp_path, monkeypatch):
    """The check itself: a work item by number is found; an upstream citation is not."""
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    n = "3" + "6"  # spelt so that this file does not find itself
    (tmp_path / "a.md").write_text(
        f"Fixed in issue {n}.\nSee keras-team/keras#21207.\nAs session {n} found; #{n} too.\n"
    )
    assert work_item_mentions(["a.md"]) == [f"a.md:1: Fixed in issue {n}.", f"a.md:3: As session {n} found; #{n} too."]


def test_the_architecture_document_is_the_design_in_at_most_400_lines():
    """Measurements live in docs/benchmarks.md, with their date, machine, command and commit."""
    lines = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 400
    commits = [line for line in lines if re.search(r"\b[0-9a-f]{7,40}\b", line) and re.search(r"\d", line)]
    dated = [line for line in lines if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert (commits, dated) == ([], [])
