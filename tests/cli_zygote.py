"""The process that `forked_cli.py` forks `amptrain` commands from: it imports TensorFlow,
Keras, keras-hub, TensorFlow Text and amptrain once, runs no TensorFlow op (so each child
starts its own runtime, with its own logical devices and TF_CONFIG), then for each request
line (JSON: args, or python for `python ARGV`; env, cwd, and the files for stdout, stderr
and the exit status) forks a child and answers its pid.

    python tests/cli_zygote.py
"""

import atexit
import json
import os
import runpy
import signal
import sys
import tempfile

import keras  # noqa: F401
import keras_hub  # noqa: F401  (the tokenizers and pretrained families: ~1 s a command otherwise)
import tensorflow as tf  # noqa: F401
import tensorflow_text  # noqa: F401
from tensorflow.python.eager import context

import amptrain.api  # noqa: F401
import amptrain.cli


def run(request):
    """In the child: the command as `python -m amptrain ARGS` (or, for a "python" request,
    `python ARGV`: a script, `-c CODE` or `-m MODULE`) would run it, after the import."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # launch and bench wait for their workers
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # TMPDIR is read again
        with open(request["stdout"], "w") as f:
            os.dup2(f.fileno(), 1)
            if request["stderr"] == request["stdout"]:  # one file, one offset: as stderr=STDOUT
                os.dup2(f.fileno(), 2)
        if request["stderr"] != request["stdout"]:
            with open(request["stderr"], "w") as f:
                os.dup2(f.fileno(), 2)
        if "python" in request:
            code = python(request["python"])
        else:
            sys.argv = ["amptrain", *request["args"]]
            code = amptrain.cli.main()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 2)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # What a normal exit runs: autograph deletes its generated modules from TMPDIR at
        # exit, and os._exit alone would leave them there.
        atexit._run_exitfuncs()
        with open(request["status"], "w") as f:
            f.write(str(code or 0))
        os._exit(0)


def python(argv):
    """`python ARGV` in this process: a script's path, `-c CODE` or `-m MODULE`, then its arguments."""
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def main():
    assert context.context()._context_handle is None, "the import ran a TensorFlow op: children would share it"
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run(request)
        print(f"pid {pid}", flush=True)


if __name__ == "__main__":
    main()
