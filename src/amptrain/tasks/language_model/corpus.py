"""A text corpus: plain UTF-8 files, read a document at a time, tokenized into a token file
that training reads a block at a time; nothing holds the whole corpus in memory.

    files = corpus_files("data/lm-kjv/train.txt")      # a file, a folder or a glob of files
    for text in documents(files): ...                  # a blank line or a file's end ends one
    record = write_tokens(files, tokenizer, ([eod], [], [eod]), "RUN/tokens-train.bin", made_from)
    tokens = cached_tokens("RUN/tokens-train.bin", made_from)   # a read-only memory map, or None
    tokens = open_tokens("RUN/tokens-train.bin", record)        # the record `write_tokens` returned

The token file is each document's pieces framed by the pieces before and after each, and
after the last (the task's `framing`). amptrain's own model: `EOD d1 EOD d2 ... EOD`; the
piece before a document is its start (what the model conditions its first piece on) and the
piece after its last is predicted from the document alone: the end of a document is learned
and scored. A pretrained one frames a document as its tokenizer frames a text, then its end piece.
A token file is reused only while what it was made from (each source's path, size and
SHA-256, the tokenizer's files, the framing: `made_from`) is unchanged and it is whole.
"""

import glob
import json
import logging
import os

import numpy as np

from amptrain.errors import DataError

logger = logging.getLogger("amptrain")
DOCUMENTS_A_CHUNK = 256  # documents tokenized in one call
CHUNK_CHARS = 1 << 20  # nor more characters than this in one call
SPAN_CHARS = 1 << 16  # the longest text the tokenizer gets: a longer document goes in spans
RECORD = ".json"  # beside a token file: what it was made from, its count and hash


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


def spans(text, limit=None):
    """`text` in pieces of at most `limit` characters (SPAN_CHARS), cut only before a single
    space between two words: every pre-tokenizer here starts a word at such a space, so the
    pieces tokenize to the same ids as the whole. A tokenizer holds each piece's offsets and
    strings: a 50 MB line tokenized whole took 10 GB. A stretch with no such space is cut
    at `limit`."""
    limit = limit or SPAN_CHARS
    start = 0
    while len(text) - start > limit:
        end = start + limit
        cut = end
        while cut > start + limit // 2 and not _word_start(text, cut):
            cut -= 1
        cut = cut if cut > start + limit // 2 else end
        yield text[start:cut]
        start = cut
    yield text[start:]


def _word_start(text, i):
    return text[i] == " " and not text[i - 1].isspace() and i + 1 < len(text) and not text[i + 1].isspace()


def encode_documents(tokenizer, texts):
    """Each text's ids; a long text is tokenized a span at a time (`spans`)."""
    pieces, owners = [], []
    for index, text in enumerate(texts):
        for span in spans(text):
            pieces.append(span)
            owners.append(index)
    ids = [[] for _ in texts]
    for owner, encoded in zip(owners, tokenizer.encode(pieces) if pieces else []):
        ids[owner].append(encoded)
    return [np.concatenate(parts) if parts else np.zeros(0, np.int32) for parts in ids]


def write_tokens(files, tokenizer, framing, path, made_from):
    """Tokenizes `files` a chunk of documents at a time into `path` (uint16 when the
    vocabulary fits, else uint32), written whole or not at all, with its record beside it
    (`path`.json: `made_from`, the dtype, the count and the SHA-256); returns the record.
    `framing`: (the pieces before each document, after each, after the last)."""
    from amptrain.files import atomic_write, sha256

    dtype = np.uint16 if tokenizer.size <= 1 << 16 else np.uint32
    partial = path + ".partial"
    count = 0
    with open(partial, "wb") as out:
        chunk, characters = [], 0
        for text in documents(files):
            chunk.append(text)
            characters += len(text)
            if len(chunk) == DOCUMENTS_A_CHUNK or characters >= CHUNK_CHARS:
                count += _write_chunk(out, tokenizer, chunk, framing, dtype)
                chunk, characters = [], 0
        count += _write_chunk(out, tokenizer, chunk, framing, dtype)
        out.write(np.array(framing[2], dtype).tobytes())
        count += len(framing[2])
    record = {"made_from": made_from, "dtype": np.dtype(dtype).name, "count": count, "sha256": sha256(partial)}
    if os.path.exists(path + RECORD):
        os.remove(path + RECORD)  # no record beside a file it does not describe, even for a moment
    os.replace(partial, path)
    atomic_write(path + RECORD, json.dumps(record, indent=1) + "\n")
    return record


def _write_chunk(out, tokenizer, texts, framing, dtype):
    before, after, _ = framing
    count = 0
    for ids in encode_documents(tokenizer, texts):
        piece = np.concatenate([before, ids, after]).astype(dtype)
        out.write(piece.tobytes())
        count += len(piece)
    return count


def cached_tokens(path, made_from):
    """The token file at `path` as a read-only memory map (pages are read as they are used),
    if its record says it was made from `made_from` and the file is whole (its size and
    SHA-256 as recorded); else None, with the reason logged, and it is to be made again."""
    from amptrain.files import sha256

    try:
        with open(path + RECORD, encoding="utf-8") as f:
            record = json.load(f)
        dtype = np.dtype(record["dtype"])
        if record["made_from"] != made_from:
            logger.info(f"{path}: made from other files or settings; tokenizing again")
            return None
        if os.path.getsize(path) != record["count"] * dtype.itemsize or sha256(path) != record["sha256"]:
            logger.warning(f"{path}: not the file its record describes (truncated or replaced); tokenizing again")
            return None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning(f"{path}{RECORD}: unreadable ({error}); tokenizing again")
        return None
    return open_tokens(path, record)


def open_tokens(path, record):
    """The token file at `path` that `record` describes, as a read-only memory map."""
    dtype = np.dtype(record["dtype"])
    return np.memmap(path, dtype=dtype, mode="r") if record["count"] else np.zeros(0, dtype)
