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


EXAMPLE_TASKS = [("parallel_sentences:ParallelSentences", SRC.parents[1] / "examples" / "parallel_sentences")]


def contract_cases():
    from amptrain import registry

    return [(name, []) for name in registry.known()] + [(name, [str(folder)]) for name, folder in EXAMPLE_TASKS]


@pytest.mark.parametrize(("name", "search"), contract_cases())
def test_every_task_implements_the_contract(name, search):
    """Every task of the registry, and the example's task named by import path."""
    from amptrain import registry
    from amptrain.tasks.base import Task

    task_class = registry.task_class(name, search)
    assert issubclass(task_class, Task)
    assert not task_class.__abstractmethods__  # else instantiating it raises TypeError
    assert task_class.primary_metric and task_class.predictions_suffix.startswith(".")


# The import order (docs/architecture.md, "Layers"): a module may import its own part, any
# part of a lower layer, and a part of its own layer unless the pair is listed as apart.
LAYERS = [
    {"errors", "files", "xla_modes", "registry", "tf_logs", "forked"},
    {"config"},
    {"data", "metrics", "models", "precision", "distribute", "hardware"},
    {"tasks", "engine"},
    {"serving", "bench", "doctor", "launch", "api", "trainer"},
    {"cli", "__init__", "__main__"},
]
APART = {("tasks", "engine"), ("engine", "tasks")}  # the engine knows no task, a task no engine


def part_of(module):
    """`amptrain.engine.loop` -> "engine"; the package itself -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(part):
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def imports_of(path):
    """(line, imported amptrain module) of every import in `path`, at any depth (a function's
    deferred import counts as much as the file's)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "amptrain":  # `from amptrain import config`
                found += [(node.lineno, f"amptrain.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, m) for line, m in found if m.split(".")[0] == "amptrain"]


def upward_imports(src):
    wrong = []
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src)
        here = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        for line, module in imports_of(path):
            there = part_of(module)
            if there == here:
                continue
            if layer_of(there) > layer_of(here) or (here, there) in APART:
                wrong.append(f"{relative}:{line} ({here}) imports {module} ({there})")
    return wrong


def test_every_part_has_a_layer():
    parts = {p.parts[0] if len(p.parts) > 1 else p.stem for p in (q.relative_to(SRC) for q in python_files())}
    assert sorted(p for p in parts if not any(p in layer for layer in LAYERS)) == []


def test_imports_run_down_the_layers():
    assert upward_imports(SRC) == []


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: `config` importing `engine` is named with its file and line."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "bad.py").write_text("def f():\n    from amptrain.engine import loop\n")
    assert upward_imports(tmp_path) == ["config/bad.py:2 (config) imports amptrain.engine (engine)"]
