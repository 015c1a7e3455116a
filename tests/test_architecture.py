"""The package's shape: layers point one way, modules stay small, bad specs fail before work."""

import ast
import pathlib

import pytest
from click.testing import CliRunner

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "otafl"


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    mods = set()
    for node in ast.walk(tree):  # module level and inside functions alike
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods.update(alias.name for alias in node.names)
    return mods


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_only_the_cli_imports_the_cli():
    offenders = [str(p.relative_to(PACKAGE)) for p in _modules()
                 if not p.relative_to(PACKAGE).as_posix().startswith("cli/") and p.name != "__main__.py"
                 and any(m == "otafl.cli" or m.startswith("otafl.cli.") for m in _imports(p))]
    assert offenders == []


@pytest.mark.parametrize("layer", ["privacy", "report", "channel"])
def test_privacy_reports_and_physics_never_import_the_training_code(layer):
    offenders = [str(p.relative_to(PACKAGE)) for p in (PACKAGE / layer).rglob("*.py")
                 if any(m == "otafl.fl" or m.startswith("otafl.fl.") for m in _imports(p))]
    assert offenders == []


def test_privacy_math_imports_nothing_above_it():
    allowed = ("otafl.privacy", "otafl.errors")
    offenders = {str(p.relative_to(PACKAGE)): sorted(m for m in _imports(p)
                                                     if m.startswith("otafl") and not m.startswith(allowed))
                 for p in (PACKAGE / "privacy").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_module_is_too_large_to_read():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in _modules()}
    assert {k: n for k, n in sizes.items() if n > 520} == {}


def test_docstrings_point_into_the_repository():
    outside = [str(p.relative_to(PACKAGE)) for p in _modules()
               for text in [p.read_text()]
               if "shared/spec" in text or "system-model.md" in text
               or "privacy.md" in text]  # the section is docs/privacy/, one page per topic
    assert outside == []


def test_a_misspelt_accountant_fails_before_any_data_is_loaded(tmp_path, monkeypatch):
    import otafl.data
    import otafl.fl.loop
    import otafl.setup
    from otafl.cli.main import cli

    def no_loading(*args, **kwargs):
        raise AssertionError("data loaded before the spec was validated")

    monkeypatch.setattr(otafl.data, "load_dataset", no_loading)
    monkeypatch.setattr(otafl.setup, "build_run", no_loading)
    monkeypatch.setattr(otafl.fl.loop, "build_run", no_loading)
    spec = tmp_path / "typo.toml"
    spec.write_text('[privacy]\naccountants = ["tigth"]\n')
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", str(spec), "--out", str(out)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "'tigth'" in lines[0] and "tight" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("module", ["otafl", "otafl.cli.main"])
def test_the_cli_runs_as_a_module(module):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Usage:" in out.stdout and "sweep" in out.stdout, out.stderr


# --------------------------------------------------------------------------- the import graph

def _module_name(path: pathlib.Path) -> str:
    return path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")


def _graph() -> dict[str, set[str]]:
    """Module -> the otafl modules it imports (module level and inside functions; not the
    ``if TYPE_CHECKING`` blocks, which never run)."""
    modules = {_module_name(p): p for p in _modules()}
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree)
                       if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                       for n in ast.walk(block)}
        deps = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name and t != "otafl"}
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


#: The layers, bottom first; a module belongs to the layer of its longest matching prefix and
#: may import only modules of its own layer or below. The run setup sits below the loop that
#: uses it, the strategies' implementations (otafl.fl) below the spec that names them.
LAYERS = [
    ("otafl.errors", "otafl.names", "otafl.limits", "otafl.device", "otafl.progress", "otafl.results", "otafl.heap",
     "otafl.reaper", "otafl.publish"),
    ("otafl.privacy",),
    ("otafl.channel", "otafl.transmit", "otafl.sampling", "otafl.estimate", "otafl.data", "otafl.models"),
    ("otafl.fl",),
    ("otafl.validation", "otafl.config"),
    ("otafl.setup",),
    ("otafl.fl.loop",),
    ("otafl.sweep", "otafl.api", "otafl.report"),
    ("otafl.cli", "otafl.__main__", "otafl"),
]


def _layer(module: str) -> int:
    best = max(((len(prefix), i) for i, group in enumerate(LAYERS) for prefix in group
                if module == prefix or module.startswith(prefix + ".")), default=(0, len(LAYERS)))
    return best[1]


def test_the_import_graph_has_no_cycle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_a_higher_layer():
    graph = _graph()
    upward = sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps if _layer(b) > _layer(a))
    assert upward == []
    assert all(_layer(m) < len(LAYERS) for m in graph)  # every module has a layer


def test_the_loop_names_no_aggregation_and_no_algorithm():
    import re

    text = (PACKAGE / "fl" / "loop.py").read_text()
    assert re.findall(r"aggregation ==|algorithm ==|local is None|digital is not None|\"ota\"|\"fedsgd\"", text) == []


def test_validation_reads_the_strategy_names_without_importing_the_training_code():
    import subprocess
    import sys

    code = ("import sys; from otafl.config import load_spec; "
            "load_spec('experiments/quickstart.toml', [\"train.algorithm='scaffold'\", \"train.local_steps=2\"]); "
            "print(sorted(m for m in sys.modules if m.startswith('otafl.fl')), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['otafl.fl', 'otafl.fl.strategies'] False"  # nor torch (otafl/names.py)


def test_a_toy_aggregation_is_one_class_and_one_registry_line(monkeypatch):
    """A new aggregation reaches the loop, the facts and the accountants through the registry
    alone: here a noiseless one whose server sees every gradient twice (so the update doubles)."""
    import math

    import torch

    from otafl.config import load_spec
    from otafl.fl import strategies
    from otafl.fl.aggregations import Ideal
    from otafl.fl.loop import run_experiment

    calls = []

    class Doubling(Ideal):
        def round(self, grads, h, active, generator):
            agg = super().round(grads, h, active, generator)
            calls.append(int(active.sum()))
            agg.aligned_sum = 2 * agg.aligned_sum
            return agg

    monkeypatch.setitem(strategies.AGGREGATIONS, "toy", strategies.Strategy("toy", Doubling, "test only"))
    sets = ["data.users=20", "train.rounds=3", "train.eval_every=3", "privacy.accountants=['tight']",
            "train.optimizer='sgd'", "train.lr=0.1"]
    toy = run_experiment(load_spec("experiments/quickstart.toml", sets + ["train.aggregation='toy'"]))
    ideal = run_experiment(load_spec("experiments/quickstart.toml", sets + ["train.aggregation='ideal'"]))
    assert len(calls) == 3 and toy.summary["aggregation"] == "toy"
    assert toy.rounds[0]["train_loss"] == ideal.rounds[0]["train_loss"]  # same data, same first model
    assert toy.rounds[1]["train_loss"] != ideal.rounds[1]["train_loss"]  # a doubled first step
    assert all(f.alignment_gain == math.inf and float(f.noise_var.sum()) == 0 for f in toy.facts)
    assert toy.summary["tight_epsilon_central"] == math.inf  # no noise: the accountant sees it
    assert isinstance(toy.facts[0].participation_prob, torch.Tensor)
