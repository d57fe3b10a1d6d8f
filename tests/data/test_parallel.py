"""The parallel-text reader: pairs with their line, and `path:line` errors."""

import pytest

from amptrain.data.parallel import read_parallel
from amptrain.errors import DataError


def test_a_tsv_file_gives_pairs_with_their_line(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text("In the beginning\tEn el principio\r\nAnd God said \tY dijo Dios\n", encoding="utf-8")
    pairs = read_parallel(str(path))
    assert [(p.source, p.target, p.line) for p in pairs] == [
        ("In the beginning", "En el principio", 1),
        ("And God said", "Y dijo Dios", 2),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("a\tb\nno tab here\n", ":2: expected source<TAB>target (one tab), received no tab: 'no tab here'"),
        ("a\tb\tc\n", ":1: expected source<TAB>target (one tab), received 2 tabs"),
        ("a\tb\n \tb\n", ":2: the source side is empty"),
        ("a\t \n", ":1: the target side is empty"),
        ("a\tb\n\nc\td\n", ":2: expected source<TAB>target (one tab), received no tab: ''"),
        ("", ": no sentence pairs"),
    ],
)
def test_a_malformed_tsv_line_is_named(tmp_path, text, message):
    path = tmp_path / "bad.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as error:
        read_parallel(str(path))
    assert str(error.value).startswith(f"{path}{message}")


def test_two_aligned_files_pair_line_by_line(tmp_path):
    (tmp_path / "s.en").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "t.es").write_text("uno\ndos\n", encoding="utf-8")
    pairs = read_parallel(str(tmp_path / "s.en"), str(tmp_path / "t.es"))
    assert [(p.source, p.target, p.line) for p in pairs] == [("one", "uno", 1), ("two", "dos", 2)]


def test_files_of_different_lengths_name_where_the_shorter_ends(tmp_path):
    (tmp_path / "s.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "t.es").write_text("uno\ndos\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"t\.es:3: ends here, but .*s\.en has 3 lines"):
        read_parallel(str(tmp_path / "s.en"), str(tmp_path / "t.es"))


def test_an_empty_line_in_one_of_two_files_is_named(tmp_path):
    (tmp_path / "s.en").write_text("one\n\n", encoding="utf-8")
    (tmp_path / "t.es").write_text("uno\ndos\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"s\.en:2: empty line"):
        read_parallel(str(tmp_path / "s.en"), str(tmp_path / "t.es"))
