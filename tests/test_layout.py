"""The code layout the project keeps (docs/architecture.md): under src/, no file over 400
lines and no function over 60 (one exception: `config.validate`, a table of checks), and
the Task contract implemented by every task."""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "amptrain"
LONG_ALLOWED = {("config/validation.py", "validate")}


def python_files():
    return sorted(SRC.rglob("*.py"))


def test_no_source_file_is_over_400_lines():
    long = {str(p.relative_to(SRC)): n for p in python_files() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_no_function_is_over_60_lines():
    long = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                where = (str(path.relative_to(SRC)), node.name)
                if lines > 60 and where not in LONG_ALLOWED:
                    long.append((*where, lines))
    assert long == []


@pytest.mark.parametrize("name", ["classification", "ner", "translation"])
def test_every_task_implements_the_contract(name):
    from amptrain.tasks import TASKS
    from amptrain.tasks.base import Task

    task_class = TASKS[name]
    assert issubclass(task_class, Task)
    assert not task_class.__abstractmethods__  # else instantiating it raises TypeError
    assert task_class.primary_metric and task_class.predictions_suffix.startswith(".")
