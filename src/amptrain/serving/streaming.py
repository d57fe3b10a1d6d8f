"""`amptrain predict --input FILE`: records written as each chunk of lines is computed, with
progress on stderr, the model loaded once.

    predict = predictor("runs/classify-spam", True, api.load_run)   # the model loaded once
    for record in predict_lines(predict, read_text_lines("texts.txt")):
        print(json.dumps(record))

Predicting the whole file in one call held every record until the end (20,000 lines: 15.6 s
of nothing, then all of them, 1.0 GB resident); chunks of CHUNK_LINES bound the memory
and let a reader of the output start at once.
"""

import codecs
import sys
import time

from amptrain.errors import DataError, UserError

CHUNK_LINES = 512
PROGRESS_EVERY = 5.0  # seconds between progress lines when stderr is no terminal
# A line longer than this is no text to predict: a model reads its first `data.max_length`
# pieces, and a 200 MB line took 46 s and 7 GB before its one record.
MAX_LINE_BYTES = 4 << 20


def read_text_lines(path):
    """The lines of a UTF-8 file, newlines stripped, read as they are asked for. The file is
    checked first (bytes only, fast), so a missing file, bad bytes or a line over
    MAX_LINE_BYTES are one line naming the path before any model loads or any record is written."""
    _check_utf8(path)
    return _lines(path)


def _check_utf8(path):
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line, run = 0, 1, 0  # the line being read, and its bytes so far
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as error:
                    raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {offset + error.start})") from None
                offset += len(block)
                parts = block.split(b"\n")
                for number, part in enumerate(parts):
                    run = run + len(part) if number == 0 else len(part)
                    if run > MAX_LINE_BYTES:
                        raise DataError(
                            f"{path}:{line + number}: a line of over {MAX_LINE_BYTES >> 20} MiB; expected one text "
                            "a line (a model reads only its first data.max_length pieces)"
                        )
                line += len(parts) - 1
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {offset + error.start})") from None
    except OSError as error:
        raise UserError(f"{path}: {error.strerror}") from None


def _lines(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        for line in f:
            yield line.rstrip("\r\n")


def _chunks(lines, size):
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def predictor(run_dir, skip_blank, load_run, trust=False, overrides=(), precision=None):
    """texts -> records with the run's best checkpoint (`load_run`: `api.load_run`, handed down
    so that serving imports nothing above it) or the export's SavedModel, built once. Its
    `task_class` is the Task subclass that made the records (how they print: `printed_field`).
    `skip_blank`: blank texts are left out, unless the task keeps them (`keeps_blank_lines`)."""
    from amptrain.serving.served import export_predictor, find_export

    exported = find_export(run_dir)
    if exported is not None:
        return export_predictor(exported, skip_blank, trust, overrides, precision)
    task, model, predict_fn, _ = load_run(run_dir, (), trust, overrides, precision)

    def predict(texts):
        if skip_blank and not task.keeps_blank_lines:
            texts = [t for t in texts if t.strip()]
        return task.predict_texts(texts, model, predict_fn) if texts else []

    predict.task_class = type(task)
    return predict


def predict_lines(predict, lines, chunk_lines=CHUNK_LINES, stream=None):
    """Yields one record a line of `lines` (blank ones skipped, except by a task that keeps
    them: `predictor`'s `skip_blank`), a chunk at a time through `predict` (a `predictor`);
    progress (lines done, lines/s) goes to `stream` (stderr)."""
    stream = stream if stream is not None else sys.stderr
    interactive = stream.isatty()
    started = shown = time.time()
    done = written = 0
    for chunk in _chunks(lines, chunk_lines):
        records = predict(chunk)
        written += len(records)
        yield from records
        done += len(chunk)
        now = time.time()
        line = f"predict: {done:,} lines ({done / max(now - started, 1e-9):,.0f} lines/s)"
        if interactive:
            stream.write("\r" + line)
            stream.flush()
        elif now - shown >= PROGRESS_EVERY:
            stream.write(line + "\n")
            shown = now
    if interactive and done:
        stream.write("\n")
    if done and not written:
        stream.write(f"predict: {done:,} lines, all blank: no record (blank lines are skipped)\n")
    elif done and not interactive:
        stream.write(f"predict: {done:,} lines done in {time.time() - started:.1f} s\n")
