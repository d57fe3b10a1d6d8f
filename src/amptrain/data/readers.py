"""Readers that turn a data file into plain Python examples with their source line.

    examples = read_labelled_text("data/classify-spam/train.csv")
    examples[0]  # Example(text="US rejects ...", label="ham", line=2)

`tf.data`'s CSV parser names no file or line and `ignore_errors()` drops rows silently,
so files are read and checked here, in Python, and every error starts with `path:line`.
"""

import csv
import json
import os
from dataclasses import dataclass

from amptrain.errors import DataError

# Spam bodies reach 1,500 characters; the csv module's default limit is 128 kB.
csv.field_size_limit(10 * 1024 * 1024)


@dataclass(frozen=True)
class Example:
    text: str
    label: str
    line: int


def detect_format(path, format="auto"):
    if format != "auto":
        return format
    extension = os.path.splitext(path)[1].lower().lstrip(".")
    if extension in ("csv", "tsv", "jsonl", "conll"):
        return extension
    if extension == "json":
        return "jsonl"
    raise DataError(
        f"{path}: cannot tell the format from the extension {extension!r}; "
        "set data.format to csv, tsv, jsonl (classification) or conll (ner)"
    )


def read_labelled_text(path, text_column="text", label_column="label", format="auto"):
    """Reads `text,label` rows from CSV (with a header), TSV (with a header) or JSONL."""
    format = detect_format(path, format)
    if format not in ("csv", "tsv", "jsonl"):
        raise DataError(f"{path}: task classification reads csv, tsv or jsonl files, not {format}")
    if format == "jsonl":
        examples = read_lines(path, lambda f: list(_read_jsonl(f, path, text_column, label_column)))
    else:
        delimiter = "\t" if format == "tsv" else ","
        examples = read_lines(path, lambda f: list(_read_delimited(f, path, delimiter, text_column, label_column)))
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def read_lines(path, parse):
    """`parse(file)` of a UTF-8 text file (newlines as written), a missing file or bad
    bytes reported as a DataError naming the path. A byte-order mark (a spreadsheet's
    "CSV UTF-8" starts with one) is read as what it is, not as part of the first line."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            return parse(f)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def _read_delimited(f, path, delimiter, text_column, label_column):
    reader = csv.reader(f, delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"{path}:1: empty file; expected a header with {text_column!r} and {label_column!r}") from None
    except csv.Error as error:
        raise DataError(f"{path}:1: {error}") from None
    for column in (text_column, label_column):
        if column not in header:
            raise DataError(
                f"{path}:1: header has no column {column!r}; found {header}; set data.text_column / data.label_column"
            )
    text_index, label_index = header.index(text_column), header.index(label_column)
    line = reader.line_num + 1  # where the next record starts
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise DataError(f"{path}:{line}: {error}") from None
        if row:
            if len(row) != len(header):
                raise DataError(
                    f"{path}:{line}: expected {len(header)} fields ({', '.join(header)}), received {len(row)}"
                )
            yield _example(path, line, row[text_index], row[label_index], text_column, label_column)
        line = reader.line_num + 1


def json_object(path, line, raw):
    """The JSON object on line `line` of a JSONL file, or a DataError naming path and line."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{line}: not valid JSON: {error.msg} (column {error.colno})") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}:{line}: expected a JSON object, received {type(record).__name__}")
    return record


def _read_jsonl(f, path, text_column, label_column):
    for line, raw in enumerate(f, start=1):
        if not raw.strip():
            continue
        record = json_object(path, line, raw)
        for column in (text_column, label_column):
            if column not in record:
                raise DataError(f"{path}:{line}: no key {column!r}; found {sorted(record)}")
        yield _example(path, line, record[text_column], record[label_column], text_column, label_column)


def _example(path, line, text, label, text_column, label_column):
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{path}:{line}: {text_column!r} is empty; expected some text")
    if isinstance(label, (int, bool)) or label is None:
        label = "" if label is None else str(label)
    if not isinstance(label, str) or not label.strip():
        raise DataError(f"{path}:{line}: {label_column!r} is empty; expected a label")
    return Example(text=text, label=label.strip(), line=line)


def label_vocabulary(examples):
    """The sorted set of labels of the training split."""
    return sorted({example.label for example in examples})


def label_ids(examples, labels, path):
    """Maps labels to ids; a label unseen in training is an error naming it and its line."""
    index = {label: i for i, label in enumerate(labels)}
    ids = []
    for example in examples:
        if example.label not in index:
            raise DataError(f"{path}:{example.line}: label {example.label!r} is not in the training labels {labels}")
        ids.append(index[example.label])
    return ids
