"""The code layout the project keeps (docs/architecture.md): under src/, no file over 400
lines and no function over 60 (one exception: `config.validate`, a table of checks); the
Task contract implemented by every task, each built-in one a package with its serving
module; imports that run down the layers, with no circle and no module named by a string
outside the registry; one class called `Trainer`."""

import ast
import pathlib
import re

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
    {"errors", "files", "xla_modes", "registry", "tf_logs", "forked", "gguf_files"},
    {"config"},
    {"data", "metrics", "models", "precision", "distribute", "hardware", "serving"},
    {"tasks", "engine"},
    {"autoprecision", "exports", "bench", "doctor", "launch", "api", "trainer"},
    {"commands", "cli", "__init__", "__main__"},
]
APART = {("tasks", "engine"), ("engine", "tasks")}  # the engine knows no task, a task no engine
# The one module that may import an amptrain module named by a string: the config names its
# task ("classification", or "module:Class"), read before the task is known.
STRING_LOOKUP_ALLOWED = {"registry.py"}
IMPORTING_CALLS = {"import_module", "__import__", "import_object", "find_spec"}
MODULE_NAME = re.compile(r"amptrain(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")


def part_of(module):
    """`amptrain.engine.loop` -> "engine"; the package itself -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(part):
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def module_name(src, path):
    """`src/engine/loop.py` -> "amptrain.engine.loop"; a package's `__init__.py` -> the package."""
    parts = ("amptrain", *path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path, package=None):
    """(line, imported amptrain module) of every import in `path`, at any depth (a function's
    deferred import and one under `if TYPE_CHECKING:` count as much as the file's); `package`:
    the dotted name of the module's package, for relative imports. `from amptrain.x import y`
    names `amptrain.x.y` (a module or a name in x, which `resolve` tells apart)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return [(line, m) for line, m in found if m.split(".")[0] == "amptrain"]


def resolve(name, modules):
    """The module `name` is or lies in: `amptrain.config.load_config` -> `amptrain.config`."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def docstrings(tree):
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def string_imports(src):
    """Each place outside the registry that names an amptrain module in a string a program
    can import by: a string argument of `import_module` and the like, or any other string
    (a docstring aside) that is an existing module's dotted name or a "module:Class" path."""
    modules = {module_name(src, p) for p in src.rglob("*.py")}
    found = []
    for path in sorted(src.rglob("*.py")):
        relative = str(path.relative_to(src))
        if relative in STRING_LOOKUP_ALLOWED:
            continue
        tree = ast.parse(path.read_text())
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                text = node.value.strip()
                if MODULE_NAME.fullmatch(text) and text.partition(":")[0] in modules:
                    found.append(f"{relative}:{node.lineno} names {text!r}")
            elif isinstance(node, ast.Call) and node.args:
                called = getattr(node.func, "attr", getattr(node.func, "id", ""))
                first = node.args[0]
                named = isinstance(first, ast.Constant) and str(first.value).startswith("amptrain")
                if called in IMPORTING_CALLS and named:
                    found.append(f"{relative}:{node.lineno} imports {first.value!r} by name")
    return sorted(set(found))


def import_graph(src):
    """{module: {amptrain modules it imports}}, every import counted; a package's own
    `__init__` counts as the package."""
    modules = {module_name(src, p): p for p in src.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = {resolve(m, modules) for _, m in imports_of(path, package)}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def circles(graph):
    """The import circles of `graph`: each strongly connected set of more than one module,
    sorted (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(start):
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.add(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def upward_imports(src):
    wrong = []
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src)
        here = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        for line, module in imports_of(path, module_name(src, path).rpartition(".")[0]):
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


def test_no_module_imports_itself_through_others():
    assert circles(import_graph(SRC)) == []


def test_no_amptrain_module_is_imported_by_a_name_string_outside_the_registry():
    assert string_imports(SRC) == []


def test_one_class_is_called_trainer():
    found = [
        str(path.relative_to(SRC))
        for path in python_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "Trainer"
    ]
    assert found == ["trainer.py"]


def test_every_built_in_task_is_a_package_holding_its_serving_module():
    from amptrain import registry

    for name in registry.known():
        task_class = registry.task_class(name)
        folder = SRC / "tasks" / name
        assert (folder / "__init__.py").is_file() and (folder / "serving.py").is_file(), name
        assert isinstance(task_class.serving_module, type), (name, task_class.serving_module)
        assert task_class.serving_module.__module__ == f"amptrain.tasks.{name}.serving"


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: `config` importing `engine` is named with its file and line."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "bad.py").write_text("def f():\n    from amptrain.engine import loop\n")
    assert upward_imports(tmp_path) == ["config/bad.py:2 (config) imports amptrain.engine.loop (engine)"]


def test_a_planted_circle_is_caught(tmp_path):
    """The check itself: a circle through a deferred import, an `if TYPE_CHECKING:` import and a
    package's `__init__` importing its submodule, all three counted."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("from amptrain.data import readers\n")
    (tmp_path / "data" / "readers.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from amptrain.data.tokens import Piece\n"
    )
    (tmp_path / "data" / "tokens.py").write_text("def f():\n    import amptrain.data\n")
    (tmp_path / "data" / "alone.py").write_text("from amptrain.data.readers import x\n")
    assert circles(import_graph(tmp_path)) == [["amptrain.data", "amptrain.data.readers", "amptrain.data.tokens"]]


def test_a_planted_string_import_is_caught(tmp_path):
    """The check itself: a module named by a string outside the registry, by call or by a
    "module:Class" path, is named with its file and line; the registry's own and a docstring's are not."""
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "served.py").write_text("")
    (tmp_path / "tasks.py").write_text(
        '"""See amptrain.serving.served."""\nimport importlib\n'
        'MODULE = "amptrain.serving.served:Module"\n'
        'def f():\n    return importlib.import_module("amptrain.serving.served")\n'
    )
    (tmp_path / "registry.py").write_text('TASKS = {"x": "amptrain.serving.served:Module"}\n')
    assert string_imports(tmp_path) == [
        "tasks.py:3 names 'amptrain.serving.served:Module'",
        "tasks.py:5 imports 'amptrain.serving.served' by name",
        "tasks.py:5 names 'amptrain.serving.served'",
    ]
