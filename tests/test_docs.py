"""The front door stays a front door: the README short, every config key documented,
no text pointing to notes outside the repository."""

import dataclasses
import pathlib
import subprocess

from amptrain.config.sections import Config

ROOT = pathlib.Path(__file__).resolve().parents[1]


def config_keys():
    keys = ["task"]
    for section in dataclasses.fields(Config):
        if dataclasses.is_dataclass(section.type):
            keys += [f"{section.name}.{key.name}" for key in dataclasses.fields(section.type)]
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
