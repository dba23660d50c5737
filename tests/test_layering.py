"""The import structure, read from the source (every `import`, at module level or inside a
function): which package may import which (docs/architecture.md, "Layers"), and no cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ("roll_agent", "envs", "sandboxes")


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module of ours that `name` (a module, or a name inside one) is, or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # `from pkg import sub` imports the submodule; `from mod import name`, the module
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found |= {owner for n in names if (owner := _owner(n)) and owner != module}
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


# (importer, what it must not import, what is allowed anyway)
RULES = [
    # sandboxes stand alone but for the registry that names their backends (it imports nothing of ours)
    ("sandboxes", "roll_agent", ("roll_agent.registry",)), ("sandboxes", "envs", ()),
    ("roll_agent.registry", "roll_agent", ("roll_agent.registry",)), ("roll_agent.registry", "envs", ()),
    ("roll_agent.registry", "sandboxes", ()),
    ("envs", "roll_agent", ()),
    ("roll_agent.config", "roll_agent", ("roll_agent.config", "roll_agent.registry")),
    ("roll_agent.config_loader", "roll_agent", ("roll_agent.config", "roll_agent.config_loader", "roll_agent.registry")),
    ("roll_agent.types", "roll_agent", ("roll_agent.types",)),
    ("roll_agent.proxy", "roll_agent.rollout", ()), ("roll_agent.proxy", "roll_agent.train", ()),
    ("roll_agent.train", "roll_agent.rollout", ()), ("roll_agent.train", "roll_agent.proxy", ()),
    ("roll_agent.rollout", "roll_agent.train", ()),
    # the agent endpoint serves through the proxy's contract; it knows no trainer
    ("roll_agent.agents", "roll_agent.train", ()), ("roll_agent.agents", "roll_agent.proxy", ()),
    ("roll_agent.agents", "roll_agent.rollout", ()),  # the rollout plays agent episodes: it imports agents
    # weight syncs know the engines' and the trainer's contracts only
    *[("roll_agent.sync", layer, ()) for layer in ("roll_agent.proxy", "roll_agent.rollout", "roll_agent.train")],
    # the composition: only run.py opens a runtime; no component knows where it runs
    *[(component, "roll_agent.runtime", ()) for component in (
        "roll_agent.proxy", "roll_agent.rollout", "roll_agent.train", "roll_agent.sync", "roll_agent.controller",
        "roll_agent.checkpoint", "roll_agent.metrics", "roll_agent.watchdog", "roll_agent.config", "roll_agent.agents",
        "envs")],
    *[(component, "roll_agent.controller", ()) for component in (
        "roll_agent.proxy", "roll_agent.rollout", "roll_agent.train", "roll_agent.sync", "roll_agent.runtime",
        "roll_agent.agents")],
    ("roll_agent", "roll_agent.run", ()),  # the entry point is imported by nothing of ours
]


@pytest.mark.parametrize(("importer", "forbidden", "allowed"), RULES, ids=lambda v: v if isinstance(v, str) else "")
def test_layering(importer, forbidden, allowed):
    wrong = sorted(f"{m} imports {t}" for m, targets in GRAPH.items() if _within(m, importer)
                   for t in targets if _within(t, forbidden) and not any(_within(t, a) for a in allowed))
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph: each must be one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_sees_lazy_and_relative_imports():
    """The reader is not blind: a function-level import and a `from . import x` are both edges."""
    assert "roll_agent.runtime.trainer_process" in GRAPH["roll_agent.runtime.local"]  # inside make_trainer
    assert "sandboxes.procs" in GRAPH["sandboxes.pool"]  # from . import procs
    assert len(MODULES) > 60
