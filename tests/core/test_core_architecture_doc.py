"""docs/architecture.md is the module map: every path it names exists, and every package and public
top-level module of the three packages is on it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def _named_paths(text: str) -> set[str]:
    """Paths the map names: indented tree entries resolved against their parents, and paths in prose."""
    names: set[str] = set()
    stack: list[tuple[int, str]] = []
    block = text.split("```", 2)[1]
    for line in block.splitlines():
        m = re.match(r"^( *)([\w./-]+/|[\w.-]+\.(?:py|yaml))(?=\s|$)", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        names.add(parent + name)
        if name.endswith("/"):
            stack.append((indent, parent + name))
    for m in re.finditer(r"\b((?:stare_tir|envs|sandbox|scripts|configs|tests|docs)/[\w/.-]+\.(?:py|yaml|md))", text):
        names.add(m.group(1))
    return names


def test_every_path_the_map_names_exists():
    names = _named_paths(DOC.read_text())
    assert len(names) > 30, sorted(names)
    missing = sorted(n for n in names if not (ROOT / n.rstrip("/")).exists())
    # listed siblings on one line ("hf.py; sglang/") are checked by the prose pass too
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_and_top_level_module_is_on_the_map():
    text = DOC.read_text()
    for pkg in ("stare_tir", "envs", "sandbox"):
        for child in sorted((ROOT / pkg).iterdir()):
            is_module = child.suffix == ".py" and not child.name.startswith("_")
            is_package = child.is_dir() and (child / "__init__.py").exists()
            if is_module or is_package:
                name = child.name + ("/" if is_package else "")
                assert name in text, f"{pkg}/{name} is not on docs/architecture.md's module map"
