"""Parallel text for translation: `source<TAB>target` a line, or two aligned files.

    pairs = read_parallel("data/translate-en-es/train.tsv")
    pairs[0]  # Pair(source="And they departed ...", target="Y partiendo ...", line=1)
    pairs = read_parallel("train.en", target_path="train.es")   # line i of each file

Every error starts with `path:line`: a line without a tab (or with more than one), an
empty side, files of different lengths.
"""

from dataclasses import dataclass

from amptrain.data.readers import read_lines
from amptrain.errors import DataError


@dataclass(frozen=True)
class Pair:
    source: str
    target: str
    line: int


def read_parallel(path, target_path=""):
    """The pairs of a TSV file, or of two aligned files when `target_path` is given."""
    if target_path:
        sources = read_lines(path, _lines)
        targets = read_lines(target_path, _lines)
        if len(sources) != len(targets):
            shorter, longer = (path, target_path) if len(sources) < len(targets) else (target_path, path)
            raise DataError(
                f"{shorter}:{min(len(sources), len(targets)) + 1}: ends here, but {longer} has "
                f"{max(len(sources), len(targets))} lines; expected two files aligned line by line "
                f"({len(sources)} source lines, {len(targets)} target lines)"
            )
        pairs = []
        for number, (source, target) in enumerate(zip(sources, targets), start=1):
            for side_path, text in ((path, source), (target_path, target)):
                if not text.strip():
                    raise DataError(
                        f"{side_path}:{number}: empty line; expected a sentence "
                        f"(its pair is line {number} of the other file)"
                    )
            pairs.append(Pair(source.strip(), target.strip(), number))
    else:
        pairs = [_pair(path, number, line) for number, line in enumerate(read_lines(path, _lines), start=1)]
    if not pairs:
        raise DataError(f"{path}: no sentence pairs")
    return pairs


def _lines(f):
    lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    return [line.rstrip("\r") for line in lines]


def _pair(path, number, line):
    fields = line.split("\t")
    if len(fields) != 2:
        what = "no tab" if len(fields) == 1 else f"{len(fields) - 1} tabs"
        raise DataError(f"{path}:{number}: expected source<TAB>target (one tab), received {what}: {_shown(line)}")
    source, target = fields[0].strip(), fields[1].strip()
    for side, text in (("source", source), ("target", target)):
        if not text:
            raise DataError(f"{path}:{number}: the {side} side is empty; expected a sentence on both sides of the tab")
    return Pair(source, target, number)


def _shown(line, limit=60):
    return repr(line if len(line) <= limit else line[:limit] + "…")
