"""The command line's arguments as text: one that is not UTF-8 is one line, not a traceback.

    not_utf8(["predict", "runs/x", "--text", "caf\udce9"])   # "amptrain: error: argument 4 ..."

On Linux Python keeps an argument's bytes that are not UTF-8 as lone surrogates
(`surrogateescape`); they fail only when printed or encoded, deep in a command.
"""


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
