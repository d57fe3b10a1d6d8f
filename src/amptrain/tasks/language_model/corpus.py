"""A text corpus: plain UTF-8 files, read a document at a time, tokenized into a token file
that training reads a block at a time; nothing holds the whole corpus in memory.

    files = corpus_files("data/lm-kjv/train.txt")      # a file, a folder or a glob of files
    for text in documents(files): ...                  # a blank line or a file's end ends one
    write_tokens(files, tokenizer, ([eod], [], [eod]), "RUN/tokens-train.bin")
    tokens = read_tokens("RUN/tokens-train.bin")         # a read-only memory map

The token file is each document's pieces framed by the pieces before and after each, and
after the last (the task's `framing`). amptrain's own model: `EOD d1 EOD d2 ... EOD`; the
piece before a document is its start (what the model conditions its first piece on) and the
piece after its last is predicted from the document alone: the end of a document is learned
and scored. A pretrained one frames a document as its tokenizer frames a text, then its end piece.
"""

import glob
import os

import numpy as np

from amptrain.errors import DataError

DOCUMENTS_A_CHUNK = 256  # documents tokenized in one call


def corpus_files(pattern):
    """The files `pattern` names, sorted: itself (a file), every file below it (a folder),
    or the files its glob matches. None found is one line naming it."""
    if os.path.isfile(pattern):
        return [pattern]
    if os.path.isdir(pattern):
        found = [os.path.join(d, f) for d, _, names in os.walk(pattern) for f in names]
    else:
        found = glob.glob(pattern, recursive=True)
    found = sorted(f for f in found if os.path.isfile(f) and not os.path.basename(f).startswith("."))
    if not found:
        raise DataError(f"{pattern}: no text file; expected a file, a folder of files or a glob of files")
    return found


def corpus_bytes(files):
    """The corpus's UTF-8 size: its files' bytes (what bits per byte divides by)."""
    return sum(os.path.getsize(f) for f in files)


def documents(files):
    """Each document's text: lines up to a blank line or the file's end, newlines kept
    between them. A file that is not UTF-8 is one line naming it and the line."""
    for path in files:
        lines, number = [], 0
        try:
            with open(path, encoding="utf-8-sig") as f:
                for line in f:
                    number += 1  # the line read; a decoding error is in the next
                    if line.strip():
                        lines.append(line)
                    elif lines:
                        yield "".join(lines).rstrip("\n")
                        lines = []
        except UnicodeDecodeError as error:
            raise DataError(f"{path}:{number + 1}: not UTF-8 text ({error.reason})") from None
        if lines:
            yield "".join(lines).rstrip("\n")


def write_tokens(files, tokenizer, framing, path):
    """Tokenizes `files` a chunk of documents at a time into `path` (uint16 when the
    vocabulary fits, else uint32), written whole or not at all; returns the token count.
    `framing`: (the pieces before each document, after each, after the last)."""
    dtype = np.uint16 if tokenizer.size <= 1 << 16 else np.uint32
    partial = path + ".partial"
    count = 0
    with open(partial, "wb") as out:
        chunk = []
        for text in documents(files):
            chunk.append(text)
            if len(chunk) == DOCUMENTS_A_CHUNK:
                count += _write_chunk(out, tokenizer, chunk, framing, dtype)
                chunk = []
        count += _write_chunk(out, tokenizer, chunk, framing, dtype)
        out.write(np.array(framing[2], dtype).tobytes())
        count += len(framing[2])
    os.replace(partial, path)
    with open(path + ".dtype", "w", encoding="utf-8") as f:
        f.write(np.dtype(dtype).name)
    return count


def _write_chunk(out, tokenizer, texts, framing, dtype):
    before, after, _ = framing
    count = 0
    for ids in tokenizer.encode(texts) if texts else []:
        piece = np.concatenate([before, ids, after]).astype(dtype)
        out.write(piece.tobytes())
        count += len(piece)
    return count


def read_tokens(path):
    """The token file at `path` as a read-only memory map (pages are read as they are used)."""
    with open(path + ".dtype", encoding="utf-8") as f:
        dtype = np.dtype(f.read().strip())
    return np.memmap(path, dtype=dtype, mode="r")
