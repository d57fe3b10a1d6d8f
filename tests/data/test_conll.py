"""The CoNLL reader: sentences, separators, and errors that name path:line."""

import pytest

from amptrain.errors import DataError
from amptrain.tasks.ner import conll


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_sentences_split_at_blank_and_whitespace_only_lines(tmp_path):
    # WNUT's train.conll separates some sentences with a lone tab
    path = write(tmp_path / "a.conll", "Empire\tB-location\nState\tI-location\n\t\nhi\tO\n\n\n@bob\tB-person\n")
    sentences = conll.read_conll(path)
    assert [(s.words, s.tags, s.line) for s in sentences] == [
        (("Empire", "State"), ("B-location", "I-location"), 1),
        (("hi",), ("O",), 4),
        (("@bob",), ("B-person",), 7),
    ]


def test_docstart_lines_end_a_sentence_and_are_skipped(tmp_path):
    path = write(
        tmp_path / "a.conll", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n-DOCSTART-\tO\nx\tO\n"
    )
    sentences = conll.read_conll(path)
    assert [(s.words, s.tags, s.line) for s in sentences] == [
        (("EU", "rejects"), ("B-ORG", "O"), 3),
        (("x",), ("O",), 6),
    ]


def test_space_separated_columns_take_the_first_as_token_and_the_last_as_tag(tmp_path):
    # Only spaces separate columns without a tab: a no-break space stays inside a token.
    path = write(tmp_path / "a.txt", "New\u00a0York  B-location\r\nrocks O\n")
    sentences = conll.read_conll(path, format="conll")
    assert sentences[0].words == ("New\u00a0York", "rocks")
    assert sentences[0].tags == ("B-location", "O")


def test_a_line_without_a_tag_names_path_and_line(tmp_path):
    path = write(tmp_path / "a.conll", "fine\tO\nlonely\n")
    with pytest.raises(DataError, match=r"a\.conll:2: expected token<TAB>tag .* received 'lonely'"):
        conll.read_conll(path)


def test_a_malformed_tag_names_path_line_and_the_tag(tmp_path):
    path = write(tmp_path / "a.conll", "fine\tO\n\nParis\tLOC\n")
    with pytest.raises(DataError, match=r"a\.conll:3: expected a tag O, B-TYPE or I-TYPE, received 'LOC'"):
        conll.read_conll(path)
    path = write(tmp_path / "b.conll", "Paris\tB-\n")
    with pytest.raises(DataError, match=r"b\.conll:1: .* received 'B-'"):
        conll.read_conll(path)


def test_empty_missing_undecodable_and_wrong_format_files(tmp_path):
    with pytest.raises(DataError, match=r"a\.conll: no sentences"):
        conll.read_conll(write(tmp_path / "a.conll", "\n\t\n"))
    with pytest.raises(DataError, match=r"missing\.conll: file not found"):
        conll.read_conll(str(tmp_path / "missing.conll"))
    (tmp_path / "b.conll").write_bytes(b"caf\xe9\tO\n")
    with pytest.raises(DataError, match=r"b\.conll: not UTF-8 text"):
        conll.read_conll(str(tmp_path / "b.conll"))
    with pytest.raises(DataError, match=r"c\.csv: task ner reads CoNLL files"):
        conll.read_conll(write(tmp_path / "c.csv", "text,label\n"))


def test_tag_set_holds_both_prefixes_of_every_training_type(tmp_path):
    train = conll.read_conll(write(tmp_path / "t.conll", "a\tB-person\nb\tO\n\nc\tI-location\n"))
    assert conll.tag_set(train) == ["O", "B-location", "I-location", "B-person", "I-person"]


def test_a_tag_outside_the_training_set_names_it_its_line_and_the_set(tmp_path):
    train = conll.read_conll(write(tmp_path / "t.conll", "a\tB-person\nb\tO\n"))
    tags = conll.tag_set(train)
    dev_path = write(tmp_path / "d.conll", "a\tO\n\nb\tI-person\nc\tB-product\n")
    with pytest.raises(
        DataError, match=r"d\.conll:4: tag 'B-product' is not in the training tag set \['O', 'B-person', 'I-person'\]"
    ):
        conll.tag_ids(conll.read_conll(dev_path), tags, dev_path)
    assert conll.tag_ids(train, tags, "t.conll") == [[1, 0]]


def test_types_to_tags_starts_each_run_of_one_type_with_b():
    types = ["person", "person", "O", "location", "person", "O", "O", "group"]
    assert conll.types_to_tags(types) == ["B-person", "I-person", "O", "B-location", "B-person", "O", "O", "B-group"]
