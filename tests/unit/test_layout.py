"""The package's shape: imports point down the floors, no cycles, no long function without
a reason, no private names across modules, no concrete sink in a generic layer.

Read from the source with `ast` (every import, also inside functions and under
TYPE_CHECKING), so the rule in CONTRIBUTING.md stays true as the code changes.
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "walstream"

#: Top to bottom: a part may import from its own floor (without a cycle) and from the
#: floors below, never from a floor above.
FLOORS: list[set[str]] = [
    {"cli"},
    {"runtime"},
    {"pipeline", "server", "testing", "client", "importers", "verify"},
    {"source", "delivery", "backfill", "streams", "lake", "engine"},
    {"capture", "postgres", "sinks", "formats", "config"},
    {"decode"},
    {"values"},
    {
        "state",
        "change",
        "errors",
        "fields",
        "secrets",
        "version",
        "backoff",
        "periodic",
        "nopandas",
    },
]
#: A function with more own lines than this says why (`# long: ...`) or is split.
MAX_OWN_LINES = 80


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each module of the package -> the walstream modules it imports."""
    out: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        mod = _module(path)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base]
            else:
                continue
            out[mod] |= {n for n in names if n == "walstream" or n.startswith("walstream.")}
        out.setdefault(mod, set())
    return out


def _part(module: str) -> str:
    """The floor unit of a module: `walstream.sinks.kafka` -> `sinks`."""
    return module.split(".")[1] if "." in module else "walstream"


def _floor(part: str) -> int:
    for i, parts in enumerate(FLOORS):
        if part in parts:
            return i
    raise AssertionError(f"walstream.{part} is on no floor: add it to FLOORS in {__file__}")


def test_every_part_is_on_a_floor() -> None:
    for module in _imports():
        if module != "walstream":
            _floor(_part(module))


def test_imports_point_down_the_floors() -> None:
    upward = set()
    for module, imported in _imports().items():
        if module == "walstream":  # the public API re-exports from anywhere
            continue
        for target in imported:
            if target == "walstream":
                upward.add((module, target))  # the public API is for users, not for parts
            elif _floor(_part(target)) < _floor(_part(module)):
                upward.add((module, target))
    assert upward == set(), "imports from a higher floor"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_between_modules_or_parts() -> None:
    imports = _imports()
    modules = {m: {t for t in ts if t in imports and t != m} for m, ts in imports.items()}
    parts: dict[str, set[str]] = defaultdict(set)
    for m, ts in imports.items():
        if m != "walstream":
            parts[_part(m)] |= {_part(t) for t in ts if t != "walstream"} - {_part(m)}
    assert _cycles(modules) == []
    assert _cycles(dict(parts)) == []


def own_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's own lines: from its `def` to its end (the signature counts: a long
    parameter list is length too), less its docstring and the functions and classes nested
    in it (they are counted on their own)."""
    assert fn.end_lineno is not None
    lines = set(range(fn.lineno, fn.end_lineno + 1))
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        assert first.end_lineno is not None
        lines -= set(range(first.lineno, first.end_lineno + 1))
    for node in ast.walk(fn):
        if node is not fn and isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        ):
            assert node.end_lineno is not None
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines -= set(range(start, node.end_lineno + 1))
    return len(lines)


def long_functions(source: str) -> dict[str, int]:
    """Functions over MAX_OWN_LINES own lines with no `# long: <reason>` comment on the
    lines right above their `def` (or its decorators)."""
    text = source.splitlines()
    out = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        n = own_lines(node)
        if n <= MAX_OWN_LINES:
            continue
        top = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        above = []
        while top > 0 and text[top - 1].strip().startswith("#"):
            above.append(text[top - 1].strip())
            top -= 1
        if not any(c.startswith("# long:") and len(c) > len("# long: ") + 10 for c in above):
            out[f"{node.name}:{node.lineno}"] = n
    return out


def test_no_function_is_long_without_a_reason() -> None:
    """A function over 80 own lines says why next to it (`# long: ...`) or is split: the
    shape of the code is its functions, not its files' lengths."""
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for name, n in long_functions(path.read_text()).items():
            long[f"{path.relative_to(PACKAGE.parent)}:{name}"] = n
    assert long == {}, "split these, or say why next to them (# long: <reason>)"


def test_the_formatter_formats_all_of_the_package() -> None:
    """No `# fmt: skip` / `# fmt: off` in the package: code packed by hand is read by
    nobody else's habits (tests may keep a hand-laid data table)."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{i}"
        for path in PACKAGE.rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if "# fmt: skip" in line or "# fmt: off" in line
    ]
    assert found == []


#: A module docstring states the module's contract; what is longer belongs in docs/.
MAX_MODULE_DOC = 20


def test_module_docstrings_state_a_contract_in_a_few_lines() -> None:
    long = {}
    for path in PACKAGE.rglob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc and (n := len(doc.splitlines())) > MAX_MODULE_DOC:
            long[str(path.relative_to(PACKAGE.parent))] = n
    assert long == {}, "say the contract; move the rest to docs/"


def test_the_function_size_check_sees_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_OWN_LINES))  # + the def line
    nested = "\n".join(f"        y{i} = {i}" for i in range(MAX_OWN_LINES - 1))
    long = f'def f():\n    """Doc."""\n{body}\n'
    assert long_functions(long) == {"f:1": MAX_OWN_LINES + 1}
    assert long_functions(long.replace("    x0 = 0\n", "")) == {}  # at the limit
    assert long_functions("# long: it walks every case of the protocol\n" + long) == {}
    assert long_functions("# long:\n" + long) == {"f:2": MAX_OWN_LINES + 1}  # no reason
    params = "\n".join(f"    p{i}: int," for i in range(MAX_OWN_LINES - 1))
    assert long_functions(f"def s(\n{params}\n) -> None:\n    pass\n") == {
        "s:1": MAX_OWN_LINES + 2  # a signature is length too
    }
    outer = f"def g():\n    def h():\n{nested}\n    return h\n"
    assert long_functions(outer) == {}  # h's lines are h's, g has two


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rule can fail: an upward import and a cycle are found in a made-up graph."""
    assert _floor("server") < _floor("sinks")  # server is above sinks
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_docs_the_code_cites_exist() -> None:
    """Every `docs/NAME.md` a module names is in the repository, and no module cites the
    design page that never was (its contracts are docs/architecture.md)."""
    import re

    root = PACKAGE.parent
    cited: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "DESIGN.md" not in text, f"{path.relative_to(root)} cites DESIGN.md"
        for name in re.findall(r"docs/([\w-]+\.md)", text):
            cited[name].add(str(path.relative_to(root)))
    missing = {n: sorted(p) for n, p in cited.items() if not (root / "docs" / n).is_file()}
    assert "architecture.md" in cited, "the code cites docs/architecture.md"
    assert not missing, missing


def test_no_module_imports_another_modules_private_names() -> None:
    """A `_name` is its module's own: another module that needs it needs a public one (a
    private *module*, like the compiled `postgres._tuples`, may be imported)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if not module.startswith("walstream"):
                continue
            for alias in node.names:  # type: ignore[attr-defined]
                name = alias.name
                where = PACKAGE.parent.joinpath(*module.split("."), name)
                is_module = where.with_suffix(".pyx").exists() or where.with_suffix(".py").exists()
                if name.startswith("_") and not name.startswith("__") and not is_module:
                    found.append(f"{path.relative_to(PACKAGE.parent)}: {module}.{name}")
    assert not found, found


#: The sinks package's generic modules: anything may import them.
SINK_CONTRACT = {"sinks", "sinks.base", "sinks.registry", "sinks.clients", "sinks.aio"}
#: The lake wing's concrete sinks: only the wing imports them (others use its contract
#: and its writer).
LAKE_SINKS = {"lake.delta", "lake.iceberg", "lake.catalog"}
#: Generic layers that still import a concrete sink, to be removed (not added to): the
#: pull streams' settings and the demo's file sink.
KNOWN_SINK_LEAKS: set[tuple[str, str]] = set()


def test_no_generic_layer_imports_a_concrete_sink() -> None:
    """Outside `sinks/` (and the lake wing), code reaches a sink through its contract
    (base, registry, its settings' hooks; the lake's contract and writer), never a
    concrete sink's module; the known leaks only shrink."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        here = _module(path).removeprefix("walstream.")
        if here.startswith("sinks.") or here == "sinks":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
                if node.module == "walstream.sinks":  # `from walstream.sinks import kafka`
                    names += [f"walstream.sinks.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                target = name.removeprefix("walstream.")
                if target.startswith("sinks") and target not in SINK_CONTRACT:
                    found.add((here, target))
                if target in LAKE_SINKS and not here.startswith("lake."):
                    found.add((here, target))
    assert found <= KNOWN_SINK_LEAKS, sorted(found - KNOWN_SINK_LEAKS)
    assert found == KNOWN_SINK_LEAKS, (
        f"no longer leaks, drop from the list: {KNOWN_SINK_LEAKS - found}"
    )
