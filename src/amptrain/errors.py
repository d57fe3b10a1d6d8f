"""Errors a user can fix: the CLI prints them as one line and exits non-zero."""

import re


class UserError(Exception):
    """A mistake in the user's input (config, data, command line), not a bug."""


class ConfigError(UserError):
    """A config key is unknown, of the wrong type or impossible."""


class DataError(UserError):
    """A data file is malformed; the message starts with `path:line`."""


class Interrupted(Exception):
    """SIGTERM arrived: raised in the main thread so training can checkpoint and leave."""


class NumericsError(Exception):
    """Training cannot go on with finite numbers (the loss scale collapsed, the loss stayed
    non-finite): the message is a diagnosis of several lines, the last good checkpoint is kept."""


class PeerLost(Exception):
    """A worker of a multi-worker run died or hung: the message names it; the chief's last
    checkpoint is kept, and rerunning the same command resumes from it."""


class CheckpointError(UserError):
    """No intact checkpoint where one is needed, or one did not read back after saving:
    one line naming the folder and what is wrong with each file."""


# TensorFlow's message for a lookup past a table's end: "indices[0,2] = 9999 is not in [0, 441)"
_OUT_OF_RANGE = re.compile(r"indices\[([\d,]+)\] = (-?\d+) is not in \[0, (\d+)\)")


REQUEST_FAULT = "request: "  # how a serving graph's assertion says the request is at fault


def request_fault(message):
    """The one-line reason a serving graph's assertion gave (`REQUEST_FAULT`), or None."""
    found = re.search(re.escape(REQUEST_FAULT) + r"([^\n]+)", message)
    return found.group(1).strip() if found else None


def id_out_of_range(message):
    """(position, id, table size) of the first lookup past a table's end that a TensorFlow
    error `message` reports, as strings; None when it reports none."""
    found = _OUT_OF_RANGE.search(message)
    return found.groups() if found else None


def not_utf8(arguments):
    """The error line for the first argument that is not UTF-8 (Python keeps its bytes as
    surrogates, which fail only when printed, deep in a command), or None."""
    for number, argument in enumerate(arguments, 1):
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError as error:
            shown = argument.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
            return (
                f"amptrain: error: argument {number} ({shown[:60]}) is not UTF-8 text "
                f"(byte at {error.start}); pass UTF-8, or the texts in a UTF-8 file with --input"
            )
    return None
