"""The README stays a front page whose commands and numbers are the code's, and the documentation site
builds and cannot drift from the config dataclasses.

- README: at most 300 lines; the algorithm table lists every preset, and each `key=value` in its
  defaults column equals what that preset resolves to; every stare-train / stare-sft / stare-eval
  command of its quick start parses as printed (`--print-config`; `--help KEY` runs as printed).
- docs/configuration.md is exactly what scripts/docs/config_reference.py writes.
- `mkdocs build --strict` passes (a broken link, a missing anchor, a page outside the nav fail it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COMMANDS = ("stare-train", "stare-sft", "stare-eval")


def readme_commands() -> list[list[str]]:
    """Every command of the README's bash blocks that runs an entry point, as an argument list
    starting with the entry point's name (environment assignments and launchers stripped)."""
    text = README.read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip().rstrip("&").strip()
            if not line:
                continue
            args = shlex.split(line)
            while args and re.fullmatch(r"[A-Z_]+=\S*", args[0]):  # CUDA_VISIBLE_DEVICES=...
                args = args[1:]
            if args and args[0] == "torchrun":  # torchrun [launcher flags] scripts/train_tir.py ...
                args = args[args.index("scripts/train_tir.py") :]
            if args and args[0] == "scripts/train_tir.py":
                args[0] = "stare-train"
            if args and args[0] in COMMANDS:
                out.append(args)
    return out


def test_readme_is_a_front_page():
    n = len(README.read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines; move detail into a page of docs/ and link it"


def test_readme_quick_start_has_the_commands_users_run():
    names = [c[0] for c in readme_commands()]
    assert {"stare-train", "stare-sft", "stare-eval"} <= set(names), names
    assert len(names) >= 8  # the walk must see the blocks, or "every command parses" is vacuous


def _main(name: str):
    from stare_tir.app import cli

    return {"stare-train": cli.train_main, "stare-sft": cli.sft_main, "stare-eval": cli.eval_main}[name]


@pytest.mark.parametrize("command", readme_commands(), ids=lambda c: " ".join(c)[:80])
def test_every_readme_command_parses_as_printed(command, monkeypatch, capsys, tmp_path):
    """Each command with --print-config (nothing runs, nothing is downloaded; --resume against a run
    directory holding a config and a checkpoint); --help KEY runs as printed."""
    monkeypatch.chdir(ROOT)
    name, args = command[0], command[1:]
    if "--help" in args:
        with pytest.raises(SystemExit) as e:
            _main(name)(args)
        assert e.value.code == 0
        assert capsys.readouterr().out.strip()
        return
    if "--resume" in args:  # a run to resume, as the README's earlier command would have left it
        from stare_tir.config import load_config, save_config
        from stare_tir.train_config import TrainConfig

        run_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("trainer.run_dir=")))
        monkeypatch.chdir(tmp_path)
        (run_dir / "checkpoints" / "step_000001").mkdir(parents=True)
        (run_dir / "checkpoints" / "latest").write_text("step_000001")
        save_config(load_config(TrainConfig, None, [f"trainer.run_dir={run_dir}"]), run_dir / "config.yaml")
    rc = _main(name)([*args, "--print-config"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    resolved = yaml.safe_load(captured.out)
    for arg in args:  # every override as printed reached the resolved config
        key, sep, value = arg.partition("=")
        if not sep or arg.startswith("-") or name == "stare-eval":
            continue
        node = resolved
        for part in key.split("."):
            node = node[part]
        assert str(node) == str(yaml.safe_load(value)) or isinstance(node, (list, dict)), (key, node, value)


def readme_algorithm_table() -> dict[str, dict[str, object]]:
    """{algo.name: {key under algo: value}} from the README's algorithm table."""
    text = README.read_text()
    section = text[text.index("## Algorithms") :]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z0-9_]+)` \|(.*)\|(.*)\|(.*)\|$", line)
        if m:
            rows[m.group(1)] = {k: yaml.safe_load(v) for k, v in re.findall(r"`([a-z0-9_.]+)=([^`]+)`", m.group(3))}
    return rows


def test_the_readme_algorithm_table_lists_every_preset_with_its_defaults():
    from stare_tir.config import flatten, resolve_config
    from stare_tir.train_config import TrainConfig, algo_presets

    table = readme_algorithm_table()
    assert set(table) == set(algo_presets()), "README algorithm table vs the presets: " + str(
        set(table) ^ set(algo_presets())
    )
    for name, defaults in table.items():
        assert defaults, f"{name}: the table gives no default"
        resolved = flatten(resolve_config(TrainConfig, {"algo": {"name": name}}).algo)
        for key, value in defaults.items():
            assert key in resolved, f"{name}: algo.{key} is not a setting"
            assert resolved[key] == value, f"README says algo.{key}={value!r} for {name}; the code: {resolved[key]!r}"


def test_the_configuration_reference_is_generated_from_the_dataclasses():
    """Checked in a fresh interpreter (`--check`: the file equals what the script writes, and every
    key of both schemas is there with its whole comment): this process's registries may hold entries
    that other tests registered, which the reference of the built-in keys must not list."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs" / "config_reference.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "is up to date" in r.stdout


def test_the_documentation_site_builds_in_strict_mode(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs and mkdocs-material are not installed (the [dev] extra brings them)")
        pytest.skip("mkdocs and mkdocs-material are not installed (pip install -e '.[dev]')")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()
