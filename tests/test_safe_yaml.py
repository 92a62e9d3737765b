"""Bounded YAML input (mhar.safe_yaml): every YAML the project reads is size-limited and refuses aliases that
expand (a "billion laughs" document), in one line before anything walks the value; error messages quote a
bounded prefix of a value. The trainer's run config and overrides, the workflow's overlays and --config, the
analysis loaders and task YAMLs each refuse a bomb in one `error:` line under a memory limit (before the fix
they ran out of memory: MemoryError with a traceback, or all of the machine's RAM)."""
from __future__ import annotations

import ast
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mhar.model.choices import brief
from mhar.safe_yaml import MAX_YAML_BYTES, MAX_YAML_NODES, YAMLRefused, check_yaml_file, read_yaml_file, \
    yaml_error_line, yaml_load

ROOT = Path(__file__).resolve().parents[1]
MEM_LIMIT = 3 << 30  # address space of the subprocesses: torch imports in < 1 GiB; an expanded bomb needs far more


def bomb(levels: int = 9, key: str = "x") -> str:
    """A few lines that expand to 9**levels strings ("billion laughs"); the last anchor is ``key``'s value."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\n{key}: *a{levels - 1}\n"


def expanded(obj, memo=None) -> int:
    """Independent count of the values a loaded document stands for (shared objects counted per reference)."""
    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    kids = (list(obj) if isinstance(obj, list) else [v for kv in obj.items() for v in kv] if isinstance(obj, dict)
            else [])
    memo[id(obj)] = n = 1 + sum(expanded(k, memo) for k in kids)
    return n


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))


def run(cmd, cwd, timeout=120, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "MHAR_DATA_DIR"}
    env.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_limit_memory)


def one_error_line(res) -> str:
    out = res.stdout + res.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, out[-3000:]
    assert "Traceback" not in out and "MemoryError" not in out, out[-3000:]
    assert len(errors[0]) < 600, errors[0][:1000]  # a bounded line, whatever the value
    return errors[0]


# --- the loader ------------------------------------------------------------------------------------------
def test_a_billion_laughs_is_refused_before_it_is_built():
    t0 = time.perf_counter()
    with pytest.raises(YAMLRefused) as e:
        yaml_load(bomb())
    assert time.perf_counter() - t0 < 2  # counted on the node graph, never expanded
    assert "billion laughs" in yaml_error_line(e.value) and str(MAX_YAML_NODES) in yaml_error_line(e.value)
    # the bound is the expansion: PyYAML's own loader (shared references) and the independent count agree
    small = bomb(levels=4)
    assert expanded(yaml.safe_load(small)) < MAX_YAML_NODES and yaml_load(small) == yaml.safe_load(small)
    over = bomb(levels=6)  # 9**6 = 531441 strings
    assert expanded(yaml.safe_load(over)) > MAX_YAML_NODES
    with pytest.raises(YAMLRefused):
        yaml_load(over)


def test_benign_aliases_load_and_a_recursive_one_is_refused():
    assert yaml_load("base: &b {lr: 3e-4}\nrun: {<<: *b, steps: 2}\n") == {"base": {"lr": 3e-4},
                                                                           "run": {"lr": 3e-4, "steps": 2}}
    with pytest.raises(YAMLRefused, match="recursive"):
        yaml_load("x: &a [1, *a]\n")
    with pytest.raises(YAMLRefused, match="recursive"):
        yaml_load("x: &a {y: *a}\n")


def test_no_alias_where_none_is_needed():
    with pytest.raises(YAMLRefused, match=r"alias \*a .*refused here"):
        yaml_load("[&a 1, *a]", aliases=False)
    assert yaml_load("[1, 1]", aliases=False) == [1, 1]


def test_size_limit_and_depth(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"x: " + b"a" * MAX_YAML_BYTES + b"\n")
    with pytest.raises(YAMLRefused, match="over the .*-byte limit"):
        read_yaml_file(big)
    with pytest.raises(YAMLRefused, match="over the .*-byte limit"):
        check_yaml_file(big)
    with pytest.raises(YAMLRefused, match="nested too deeply"):
        yaml_load("[" * 20000)
    with pytest.raises(yaml.YAMLError, match="could not determine a constructor"):
        yaml_load("!!python/object/apply:os.system [echo hi]")  # tags that build objects: never executed


def test_task_yamls_are_checked_with_their_own_tags(tmp_path):
    """check_yaml_file composes only: lm-eval's !function tag passes, a bomb does not."""
    ok = tmp_path / "ok.yaml"
    ok.write_text("task: t\nprocess_docs: !function utils.process\n")
    check_yaml_file(ok)
    bad = tmp_path / "bad.yaml"
    bad.write_text(bomb(key="task_list"))
    with pytest.raises(YAMLRefused):
        check_yaml_file(bad)


def test_brief_bounds_a_value_without_walking_it():
    huge = ["lol"] * 10**6
    assert len(brief(huge)) <= 80 and brief(huge).startswith("['lol'")
    assert len(brief("x" * 10**6)) <= 80 and brief("abc") == "'abc'"


def test_every_yaml_reader_goes_through_safe_yaml():
    """No module of the project parses YAML itself (yaml.load / safe_load / full_load / YAML()): one home."""
    readers = {"load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all", "YAML"}
    bad = []
    for folder in ("mhar", "eval", "analysis", "workflow", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")) + sorted((ROOT / folder).rglob("*.smk")):
            if path == ROOT / "mhar" / "safe_yaml.py":
                continue
            src = path.read_text()
            if path.suffix == ".smk":  # not Python: the calls are found as text
                bad += [f"{path}: yaml.{r}(" for r in readers if f"yaml.{r}(" in src]
                continue
            for node in ast.walk(ast.parse(src)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in readers and isinstance(node.func.value, ast.Name)
                        and node.func.value.id in ("yaml", "ruamel")):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: yaml.{node.func.attr}")
    assert (ROOT / "Snakefile").read_text().count("yaml.") == 0
    assert bad == []


# --- the trainer -----------------------------------------------------------------------------------------
def bomb_value(levels: int = 9) -> str:
    """A billion laughs as one flow value (anchors inline): ``[&a0 [lol x9], &a1 [*a0 x9], ...]``."""
    items = [f"&a0 [{','.join(['lol'] * 9)}]"] + [f"&a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def test_trainer_refuses_a_bomb_in_the_config_or_an_override(tmp_path):
    """A run config or a key=value override whose value is a billion laughs: one line, exit 2, nothing written
    (before: MemoryError with a traceback, the error message printing the whole value)."""
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(f"meta:\n  name: {bomb_value()}\n")
    out = tmp_path / "run"
    res = run([sys.executable, "-m", "mhar.train", str(cfg), "--out", str(out)], tmp_path)
    assert res.returncode == 2
    line = one_error_line(res)
    assert str(cfg) in line and "billion laughs" in line
    assert not out.exists()
    res = run([sys.executable, "-m", "mhar.train", str(ROOT / "config/train/cpu_tiny.yaml"),
               f"meta.name={bomb_value()}", "--out", str(out)], tmp_path)
    assert res.returncode == 2
    line = one_error_line(res)
    assert "override 'meta.name'" in line and "alias *a0" in line and "refused" in line
    assert not out.exists()


def test_a_huge_value_is_quoted_as_a_prefix(tmp_path):
    """A wrong-typed value of a megabyte: the error line quotes a bounded prefix (it printed all of it)."""
    cfg = tmp_path / "long.yaml"
    cfg.write_text("meta:\n  name: [" + ", ".join(["lol"] * 100_000) + "]\n")
    res = run([sys.executable, "-m", "mhar.train", str(cfg), "--out", str(tmp_path / "run"), "--print-config"],
              tmp_path)
    assert res.returncode == 2
    assert "meta.name: expected str, got list (['lol', 'lol', 'lol', 'lol', ...])" in one_error_line(res)


# --- the analysis loaders and lm-eval's CLI --------------------------------------------------------------------
def test_analysis_reads_a_manifest_bomb_as_one_input_error(tmp_path):
    from analysis.load.common import AnalysisInputError, read_yaml

    manifest = tmp_path / "cpt.manifest.yaml"
    manifest.write_text(f"base: a\nplain: b\nmhar: c\nscale: {bomb_value()}\n")
    with pytest.raises(AnalysisInputError, match=r"cpt.manifest.yaml: YAML aliases expand .*billion laughs"):
        read_yaml(manifest)


def test_lm_eval_cli_refuses_a_task_yaml_bomb_in_its_include_path(tmp_path):
    pytest.importorskip("lm_eval")
    mine = tmp_path / "my_tasks"
    mine.mkdir()
    (mine / "bomb.yaml").write_text(f"task: boom\ntag: {bomb_value()}\n")
    res = run([sys.executable, "-m", "eval.lm_eval_cli", "--model", "mhar", "--model_args", "pretrained=x.pt",
               "--tasks", "boom", "--include_path", str(mine)], tmp_path)
    assert res.returncode == 2
    line = one_error_line(res)
    assert str(mine / "bomb.yaml") in line and "billion laughs" in line
