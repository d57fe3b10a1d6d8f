"""A reader for CoNLL-style tagged text: one `token<TAB>tag` a line, a blank line between
sentences.

    sentences = read_conll("data/ner-wnut17/train.conll")
    sentences[0]             # Sentence(words=("@paulwalk", "It", ...), tags=("O", "O", ...), line=1)
    tags = tag_set(sentences)                    # ["O", "B-corporation", "I-corporation", ...]
    ids = tag_ids(dev_sentences, tags, dev_path)  # an unknown tag names path:line

A line is `token<TAB>tag`, or (with no tab) whitespace-separated columns whose first is
the token and whose last is the tag (CoNLL-2003's `EU NNP B-NP B-ORG`). A line of nothing
but whitespace ends a sentence, and so does a `-DOCSTART-` line (skipped). Tags are `O`,
`B-TYPE` or `I-TYPE`: BIO (IOB1) and IOB2 both read correctly under the conlleval rule
(`amptrain.tasks.ner.spans`), where an `I-` that follows no `B-` or `I-` of its type starts
an entity.
"""

import re
from dataclasses import dataclass

from amptrain.data.readers import detect_format, read_lines
from amptrain.errors import DataError

DOCSTART = "-DOCSTART-"
OUTSIDE = "O"
TAG_PATTERN = re.compile(r"^(?:O|[BI]-\S+)$")
# Columns without a tab are split on spaces only: Python's str.split() would also cut a
# token at a no-break space or an ideographic space, which noisy text holds as tokens.
SPACES = re.compile(r" +")


@dataclass(frozen=True)
class Sentence:
    words: tuple
    tags: tuple
    line: int  # of the first word; word i is on line `line + i` (a sentence has no blank line)


def read_conll(path, format="auto"):
    """Reads the sentences of a CoNLL file; every error starts with `path:line`."""
    if detect_format(path, format) != "conll":
        raise DataError(f'{path}: task ner reads CoNLL files (token<TAB>tag); set data.format = "conll"')
    sentences = read_lines(path, lambda f: list(_sentences(f, path)))
    if not sentences:
        raise DataError(f"{path}: no sentences; expected token<TAB>tag lines")
    return sentences


def _sentences(lines, path):
    words, tags, first = [], [], 0
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip() or line.split()[0] == DOCSTART:
            if words:
                yield Sentence(tuple(words), tuple(tags), first)
            words, tags = [], []
            continue
        word, tag = _columns(line, path, number)
        if not words:
            first = number
        words.append(word)
        tags.append(tag)
    if words:
        yield Sentence(tuple(words), tuple(tags), first)


def _columns(line, path, number):
    columns = line.split("\t") if "\t" in line else SPACES.split(line.strip(" "))
    columns = [c for c in columns if c]
    if len(columns) < 2:
        raise DataError(
            f"{path}:{number}: expected token<TAB>tag (or space-separated columns, the tag last), received {line!r}"
        )
    word, tag = columns[0], columns[-1].strip()
    if not TAG_PATTERN.match(tag):
        raise DataError(f"{path}:{number}: expected a tag O, B-TYPE or I-TYPE, received {tag!r}")
    return word, tag


def entity_type(tag):
    """`B-person` -> "person"; `O` -> None."""
    return None if tag == OUTSIDE else tag[2:]


def types_to_tags(types):
    """Each word's entity type (`O` for none) -> BIO tags: `B-` at the start of each run of
    words of one type, `I-` after it. Two entities of one type side by side become one."""
    tags, previous = [], OUTSIDE
    for kind in types:
        tags.append(OUTSIDE if kind == OUTSIDE else f"{'I' if kind == previous else 'B'}-{kind}")
        previous = kind
    return tags


def tag_set(sentences):
    """`O`, then `B-` and `I-` of every entity type of the training split, types sorted.

    Both prefixes of each type are in the set even if the training split only shows
    one of them, so a dev file's `I-person` after a training split of single-word
    persons is no error, and the model can predict it."""
    types = sorted({entity_type(tag) for s in sentences for tag in s.tags} - {None})
    return [OUTSIDE] + [f"{prefix}-{t}" for t in types for prefix in ("B", "I")]


def tag_ids(sentences, tags, path):
    """Each sentence's tags as ids; a tag outside the training tag set is an error naming
    it, its line and the set."""
    index = {tag: i for i, tag in enumerate(tags)}
    result = []
    for sentence in sentences:
        for offset, tag in enumerate(sentence.tags):
            if tag not in index:
                raise DataError(f"{path}:{sentence.line + offset}: tag {tag!r} is not in the training tag set {tags}")
        result.append([index[tag] for tag in sentence.tags])
    return result
