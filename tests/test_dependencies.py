"""Every third-party module that the tests, tutorials, docs build and benchmarks import is declared.

A module that the system Python happens to have (hypothesis was one) makes a green CI lie about a
fresh machine. This test reads every import in ``tests/``, ``tutorials/``, ``docs/hooks/`` and
``benchmarks/``, finds the distribution that provides each third-party module, and requires that
distribution to be named in ``pyproject.toml`` (a dependency, or an extra's), not merely pulled in by
something else: a transitive dependency can disappear in any release of its parent."""

import ast
import json
import re
import sys
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "benchmarks", "docs/hooks")
# peers that cannot share the project's environment (auto-circuit pins kaleido 0.2.1 and
# TransformerLens 2.x) run from scripts here, in environments their docstrings say how to build;
# tests/data holds the script that wrote EAP-IG's graph files with EAP-IG's own code (not installable here)
OWN_ENVIRONMENT = ("benchmarks/peers", "tests/data")
OWN = ("interp", "probes", "circuits", "jacobians", "lab")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    return _norm(re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0])


def declared_distributions(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """Distributions named in the dependencies and every extra (normalized names)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    names = {_requirement_name(r) for r in reqs if r.strip()}
    return names - {_norm(project["name"])}


def _imports_of_source(source: str) -> set[str]:
    # notebook cells may hold IPython magics and shell escapes, which are not Python
    source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def imported_modules(root: Path = ROOT) -> dict[str, str]:
    """Top-level module -> the first file (relative path) that imports it."""
    found: dict[str, str] = {}
    files = sorted(
        p for d in SCANNED for p in (root / d).rglob("*.py") if not str(p.relative_to(root)).startswith(OWN_ENVIRONMENT)
    )
    for path in files:
        for module in _imports_of_source(path.read_text()):
            found.setdefault(module, str(path.relative_to(root)))
    for nb in sorted((root / "tutorials").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                for module in _imports_of_source("".join(cell["source"])):
                    found.setdefault(module, str(nb.relative_to(root)))
    return found


def undeclared(root: Path = ROOT) -> list[str]:
    local = {p.stem for d in SCANNED for p in (root / d).rglob("*.py")}
    declared = declared_distributions(root / "pyproject.toml")
    providers = metadata.packages_distributions()
    problems = []
    for module, where in sorted(imported_modules(root).items()):
        if module in OWN or module in local or module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = {_norm(d) for d in providers.get(module, [])}
        if not dists and _norm(module) in declared:
            continue  # declared for other Pythons only (tomli, behind python_version < '3.11')
        if not dists:
            problems.append(f"{module} (imported in {where}): not installed; declare the distribution that provides it")
        elif not dists & declared:
            problems.append(
                f"{module} (imported in {where}): provided by {', '.join(sorted(dists))}, "
                "which pyproject.toml does not declare; add it to the right extra"
            )
    return problems


def test_every_third_party_import_is_declared():
    assert undeclared() == []


def test_the_check_catches_an_undeclared_import(tmp_path):
    """The same check on a copy whose extras lack hypothesis must name it."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("import hypothesis\nimport numpy\nimport tiny_models\n")
    (tmp_path / "tests" / "tiny_models.py").write_text("")
    (tmp_path / "tutorials").mkdir()
    cell = {"cell_type": "code", "source": ["%matplotlib inline\n", "import pandas as pd\n"]}
    (tmp_path / "tutorials" / "t.ipynb").write_text(json.dumps({"cells": [cell]}))
    text = (ROOT / "pyproject.toml").read_text()
    without = re.sub(r'^\s*"hypothesis[^"]*",\n', "", text, flags=re.M)
    assert without != text, "pyproject.toml no longer declares hypothesis where this test expects it"
    (tmp_path / "pyproject.toml").write_text(without)
    problems = undeclared(tmp_path)
    assert len(problems) == 1 and problems[0].startswith("hypothesis"), problems
    assert "numpy" in declared_distributions(tmp_path / "pyproject.toml")


def _bash_blocks(path: Path) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S)]


def test_the_set_up_commands_are_the_same_in_readme_and_the_docs():
    """README's two commands are CI's; the docs' set-up page must not drift from them."""
    readme, docs = _bash_blocks(ROOT / "README.md")[:2], _bash_blocks(ROOT / "docs" / "index.md")[:2]
    assert docs == readme
    assert all(b.startswith("python3 -m venv .venv") or "&& python3 -m venv .venv" in b for b in readme)
