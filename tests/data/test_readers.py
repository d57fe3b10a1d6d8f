import pytest

from amptrain.data import readers
from amptrain.errors import DataError


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_csv_with_quoted_commas_and_lines(tmp_path):
    path = write(tmp_path / "a.csv", 'text,label\n"hello, world",ham\n"two\nlines",spam\n')
    examples = readers.read_labelled_text(path)
    assert [(e.text, e.label, e.line) for e in examples] == [("hello, world", "ham", 2), ("two\nlines", "spam", 3)]


def test_malformed_row_names_path_and_line(tmp_path):
    path = write(tmp_path / "a.csv", "text,label\nfine,ham\ntoo,many,fields\n")
    with pytest.raises(DataError, match=r"a\.csv:3: expected 2 fields \(text, label\), received 3"):
        readers.read_labelled_text(path)


def test_unclosed_quote_names_the_line_where_the_record_starts(tmp_path):
    path = write(tmp_path / "a.csv", 'text,label\nfine,ham\n"never closed,spam\nmore\n')
    with pytest.raises(DataError, match=r"a\.csv:3: "):
        readers.read_labelled_text(path)


def test_missing_column_and_empty_label(tmp_path):
    path = write(tmp_path / "a.csv", "body,label\nhi,ham\n")
    with pytest.raises(DataError, match=r"a\.csv:1: header has no column 'text'"):
        readers.read_labelled_text(path)
    path = write(tmp_path / "b.csv", "text,label\nhi,\n")
    with pytest.raises(DataError, match=r"b\.csv:2: 'label' is empty"):
        readers.read_labelled_text(path)


def test_tsv_and_jsonl_with_configured_columns(tmp_path):
    path = write(tmp_path / "a.tsv", "sentence\tcategory\nhi there\tgreeting\n")
    assert readers.read_labelled_text(path, "sentence", "category")[0].label == "greeting"
    path = write(tmp_path / "a.jsonl", '{"text": "hi", "label": 1}\n\n{"text": "yo", "label": 0}\n')
    assert [(e.label, e.line) for e in readers.read_labelled_text(path)] == [("1", 1), ("0", 3)]
    path = write(tmp_path / "b.jsonl", '{"text": "hi", "label": 1}\n{"text": "hi"\n')
    with pytest.raises(DataError, match=r"b\.jsonl:2: not valid JSON"):
        readers.read_labelled_text(path)


def test_unknown_label_names_it_and_its_line(tmp_path):
    train = readers.read_labelled_text(write(tmp_path / "t.csv", "text,label\na,ham\nb,spam\n"))
    labels = readers.label_vocabulary(train)
    dev_path = write(tmp_path / "d.csv", "text,label\na,ham\nb,eggs\n")
    with pytest.raises(DataError, match=r"d\.csv:3: label 'eggs' is not in the training labels \['ham', 'spam'\]"):
        readers.label_ids(readers.read_labelled_text(dev_path), labels, dev_path)
