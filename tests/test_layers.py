"""The layers point one way — bloomline ← data_prep ← training ← eval ← flows, each importing only
those to its left — and no module imports itself back through others. Every import counts,
those inside functions too, and a string naming a module (bloomline/imports.py)."""

from pathlib import Path

from bloomline.imports import LAYERS, ROOMS, graph, imports, modules, room

REPO = Path(__file__).resolve().parents[1]


def test_no_module_imports_a_layer_to_its_right():
    known = modules(REPO)
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    up = [
        f"{p.relative_to(REPO)}:{line} imports {m}"
        for name, p in known.items()
        for line, m in imports(p, known)
        if rank[m.split(".")[0]] > rank[name.split(".")[0]]
    ]
    assert not up, up


def test_each_room_imports_only_those_before_it():
    """Every package: each room imports only itself and the rooms before it (ROOMS)."""
    assert set(ROOMS) == set(LAYERS)
    g = graph(REPO)
    unplaced = [m for m in g if room(m) is not None and room(m)[1] < 0]
    assert not unplaced, f"modules in no room of ROOMS: {unplaced}"
    up = [
        f"{m} imports {t}"
        for m, ts in g.items()
        for t in ts
        if room(m) and room(t) and room(m)[0] == room(t)[0] and room(t)[1] > room(m)[1]
    ]
    assert not up, up
    for package, rooms in ROOMS.items():
        top = REPO / package
        found = {p.name for p in top.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
        found |= {p.stem for p in top.glob("*.py") if p.stem != "__init__"}
        assert found == set(rooms), package


def test_no_import_cycles():
    """None in the whole tree: the packages, the benchmarks and the tests with their helpers."""
    g = graph(REPO, LAYERS + ("bench", "tests"))
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                cycles.append(path[path.index(t) :] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, [" → ".join(c) for c in cycles]


def test_the_checks_see_a_function_level_import(tmp_path):
    """The parser counts an import inside a function (where upward imports used to hide)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from flows.cli.app import main\n")
    assert imports(f, {"flows.cli.app": f}) == [(2, "flows.cli.app")]


def test_the_checks_see_a_module_named_in_a_string(tmp_path):
    """importlib.import_module("training.config"), a registry's "module:Class", ``python -m``'s
    argument: each is a dependency on that module, upward or not; a folder named "eval" is not."""
    f = tmp_path / "m.py"
    f.write_text('SCHEMAS = {"train": "training.config:TrainRecipe"}\nCMD = ["-m", "flows.stages.watch"]\nD = "eval"\n')
    known = {"training.config": f, "flows.stages.watch": f, "eval": f}
    assert imports(f, known) == [(1, "training.config"), (2, "flows.stages.watch")]


def test_no_test_imports_another_test_module():
    """Helpers live in tests/support/ (which bench/ may import too), never in a test module."""
    g = graph(REPO, LAYERS + ("bench", "tests"))
    found = [f"{m} imports {t}" for m, ts in g.items() for t in ts if t.rpartition(".")[2].startswith("test_")]
    assert not found, found
    assert not [p for p in (REPO / "tests" / "support").rglob("test_*.py")], "tests of the helpers go under tests/"
