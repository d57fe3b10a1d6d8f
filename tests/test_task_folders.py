"""A task is its folder (docs/architecture.md, "A task's folder"): every module a built-in
task imports from outside `tasks/<name>/` has a second user (another built-in task or an
example, which uses the public API as a user does), and no code outside the registry and a
task's own folder tests a task's name: what differs by task is a member of the Task contract
or metadata an export carries."""

import ast

from test_layout import SRC, import_graph, imports_of, resolve

from amptrain import registry

EXAMPLES = SRC.parents[1] / "examples"
TASKS = registry.known()


def task_of(module):
    """`amptrain.tasks.ner.serving` -> "ner"; a module outside every task's folder -> None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "tasks" and parts[2] in TASKS else None


def reached(graph, starts):
    """The modules outside every task's folder that `starts` import, directly or through
    other such modules."""
    seen, work = set(), list(starts)
    while work:
        for module in graph.get(work.pop(), ()):
            if module not in seen and task_of(module) is None:
                seen.add(module)
                work.append(module)
    return seen


def outside_imports(graph):
    """{task: sorted modules outside its folder that its modules import}."""
    found = {task: set() for task in TASKS}
    for module, imported in graph.items():
        if (task := task_of(module)) is not None:
            found[task] |= {m for m in imported if task_of(m) is None}
    return {task: sorted(modules) for task, modules in found.items()}


def users(graph):
    """{user: modules outside the tasks' folders it reaches}: each built-in task, and each example."""
    modules = set(graph)
    found = {task: reached(graph, [m for m in graph if task_of(m) == task]) for task in TASKS}
    for folder in sorted(p for p in EXAMPLES.iterdir() if p.is_dir()):
        direct = {resolve(m, modules) for path in folder.rglob("*.py") for _, m in imports_of(path, "example")}
        found[f"examples/{folder.name}"] = direct | reached(graph, direct)
    return found


def alone(graph):
    """["task -> module"] of every module a task imports from outside its folder that no
    other task and no example uses."""
    every = users(graph)
    return [
        f"{task} -> {module}"
        for task, modules in outside_imports(graph).items()
        for module in modules
        if not any(module in reach for user, reach in every.items() if user != task)
    ]


def test_every_module_a_task_imports_from_outside_its_folder_has_a_second_user():
    graph = import_graph(SRC)
    listing = outside_imports(graph)
    assert all(listing[task] for task in TASKS)  # the listing is real: every task imports the config at least
    assert alone(graph) == [], "\n".join(f"{t}: {', '.join(m)}" for t, m in listing.items())


def name_tests(src, names=TASKS):
    """Each comparison outside the registry and a task's own folder whose one side is a
    task's name, or a collection holding one (`task == "translation"`, `name in ("ner", ...)`)."""
    found = []
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src)
        if relative.parts == ("registry.py",):
            continue
        own = relative.parts[1] if relative.parts[0] == "tasks" and len(relative.parts) > 2 else None
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            values = [e for s in sides for e in (s.elts if isinstance(s, ast.Tuple | ast.List | ast.Set) else [s])]
            tested = {v.value for v in values if isinstance(v, ast.Constant) and v.value in names} - {own}
            found += [f"{relative}:{node.lineno} tests the task name {name!r}" for name in tested]
    return sorted(found)


def test_no_code_outside_the_registry_and_a_tasks_folder_tests_a_tasks_name():
    assert name_tests(SRC) == []


def test_a_planted_name_test_is_caught(tmp_path):
    """The check itself: comparisons and memberships are found, the task's own folder and the
    registry may name it."""
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "served.py").write_text(
        'def f(task):\n    return task != "translation" or task in ("ner", "x")\n'
    )
    (tmp_path / "tasks" / "ner").mkdir(parents=True)
    (tmp_path / "tasks" / "ner" / "task.py").write_text('OWN = lambda task: task == "ner"\n')
    (tmp_path / "registry.py").write_text('def f(task):\n    return task == "ner"\n')
    assert name_tests(tmp_path) == [
        "serving/served.py:2 tests the task name 'ner'",
        "serving/served.py:2 tests the task name 'translation'",
    ]


def test_a_module_with_one_user_is_caught():
    """The check itself: a module only the language model imports is named."""
    graph = {"amptrain.tasks.language_model.task": {"amptrain.config", "amptrain.lonely"}, "amptrain.lonely": set()}
    graph |= {"amptrain.tasks.ner.task": {"amptrain.config"}, "amptrain.config": set()}
    assert alone(graph) == ["language_model -> amptrain.lonely"]
