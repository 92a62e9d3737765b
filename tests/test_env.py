"""Settings travel through the config objects; environment variables are documented defaults read in one
place (mhar/env.py; the routing kernel knobs in mhar/model/routing, torchrun's variables in mhar/distributed)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mhar import env
from mhar.runs.config import identity_hash, pairing_hash, run_config_from_dict

ROOT = Path(__file__).resolve().parents[1]
# where reading the environment is the module's documented job
ENV_READERS = {"mhar/env.py"} | {str(p.relative_to(ROOT)) for p in (ROOT / "mhar" / "model" / "routing").rglob("*.py")} \
    | {"mhar/training/distributed.py"}


def environment_reads(path: Path) -> list[int]:
    """Lines of ``path`` that read the process environment (os.environ / os.getenv, any form)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(a.name in ("environ", "getenv") for a in node.names):
            lines.append(node.lineno)
    return lines


def test_environment_is_read_in_one_place():
    bad = {}
    for pkg in ("mhar", "eval"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel not in ENV_READERS and environment_reads(path):
                bad[rel] = environment_reads(path)
    assert bad == {}, f"read the environment through mhar.env (documented defaults): {bad}"


def test_checker_finds_environment_reads(tmp_path):
    for i, src in enumerate(["import os\nx = os.environ.get('MHAR_DATA_DIR')\n", "import os\nx = os.getenv('A')\n",
                             "from os import environ\n", "import os\nos.environ['A'] = '1'\n"]):
        (tmp_path / f"m{i}.py").write_text(src)
        assert environment_reads(tmp_path / f"m{i}.py"), src
    (tmp_path / "ok.py").write_text("import os\nos.path.join('a')\n")
    assert environment_reads(tmp_path / "ok.py") == []


def test_data_dir_explicit_then_environment_then_hub(monkeypatch, tmp_path):
    monkeypatch.delenv(env.DATA_DIR_ENV, raising=False)
    assert env.data_dir() is None and env.data_dir("") is None
    monkeypatch.setenv(env.DATA_DIR_ENV, str(tmp_path / "from_env"))
    assert env.data_dir() == tmp_path / "from_env"
    assert env.data_dir(tmp_path / "given") == tmp_path / "given"  # the explicit setting wins
    monkeypatch.setenv(env.DATA_DIR_ENV, "  ")
    assert env.data_dir() is None


def test_readers_take_the_explicit_data_dir_over_the_environment(monkeypatch, tmp_path):
    """Each former reader of MHAR_DATA_DIR honours an explicit directory (the workflow's data_dir) first."""
    from mhar.data.corpus import resolve_data_dir
    from mhar.data.config import DataConfig
    from mhar.data.tokenizer import get_tokenizer

    given, other = tmp_path / "given", tmp_path / "other"
    for d in (given, other):
        (d / "tok").mkdir(parents=True)
    monkeypatch.setenv(env.DATA_DIR_ENV, str(other))
    assert resolve_data_dir(DataConfig(data_dir=str(given))) == given
    assert resolve_data_dir(DataConfig()) == other
    with pytest.raises(ValueError, match=str(given / "tok")):  # looked up under the given dir, not the env's
        get_tokenizer("tok", data_dir=given)
    data_local = pytest.importorskip("eval.data_local")
    assert data_local.DataSource.from_env(given).data_dir == given.resolve()
    assert data_local.DataSource.from_env().data_dir == other.resolve()
    monkeypatch.delenv(env.DATA_DIR_ENV)
    assert not data_local.DataSource.from_env().is_local


def test_probe_text_from_the_given_data_dir(monkeypatch, tmp_path):
    probe = pytest.importorskip("eval.probe")
    from mhar.data.tokenizer import ByteTokenizer

    wiki = tmp_path / "mirror" / "wikitext-2-raw-v1"
    wiki.mkdir(parents=True)
    (wiki / "wiki.valid.raw").write_text("the quick brown fox " * 200)
    monkeypatch.delenv(env.DATA_DIR_ENV, raising=False)
    ids, src = probe.probe_tokens(ByteTokenizer(), 256, 2, 16, data_dir=tmp_path / "mirror")
    assert src == "text:$MHAR_DATA_DIR/wikitext-2-raw-v1/wiki.valid.raw" and ids.shape == (2, 16)  # no absolute path
    assert probe.probe_tokens(ByteTokenizer(), 256, 2, 16)[1].startswith("random")


def test_data_dir_is_a_location_not_part_of_the_hashes():
    base = {"model": {"preset": "debug"}, "data": {"corpus": "synthetic:100"}}
    plain = run_config_from_dict(base)
    moved = run_config_from_dict({**base, "data": {**base["data"], "data_dir": "/somewhere/else"}})
    assert identity_hash(plain) == identity_hash(moved) and pairing_hash(plain) == pairing_hash(moved)
    other = run_config_from_dict({**base, "data": {"corpus": "synthetic:200"}})
    assert identity_hash(other) != identity_hash(plain) and pairing_hash(other) != pairing_hash(plain)
