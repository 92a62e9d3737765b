"""Persistent compile / autotuning caches by default (mhar.env.use_compile_cache) and the trainer's startup report."""
from __future__ import annotations

import os
import time

import pytest

from mhar import env


@pytest.fixture
def fresh_env(monkeypatch):
    """As if the user had set none of the cache variables (restored afterwards)."""
    for key in env.COMPILE_CACHE_ENV:
        monkeypatch.setenv(key, "placeholder")  # monkeypatch restores the real value at teardown
        monkeypatch.delenv(key)
    monkeypatch.setattr(env, "_USER_COMPILE_ENV", {k: None for k in env.COMPILE_CACHE_ENV})
    return monkeypatch


def test_use_compile_cache_sets_defaults_and_keeps_the_users(fresh_env, tmp_path):
    got = env.use_compile_cache(tmp_path / "cc")
    assert got["env"] == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cc" / "inductor"),
                          "TRITON_CACHE_DIR": str(tmp_path / "cc" / "triton"), "TRITON_CACHE_AUTOTUNING": "1"}
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "cc" / "triton") and got["warm"] is False
    (tmp_path / "cc" / "triton").mkdir(parents=True)
    (tmp_path / "cc" / "triton" / "k.json").write_text("{}")
    assert env.use_compile_cache(tmp_path / "cc")["warm"] is True
    # a variable the user set (at import) wins
    fresh_env.setattr(env, "_USER_COMPILE_ENV", {**env._USER_COMPILE_ENV, "TRITON_CACHE_DIR": "/mine"})
    fresh_env.setenv("TRITON_CACHE_DIR", "/mine")
    assert env.use_compile_cache(tmp_path / "other")["env"]["TRITON_CACHE_DIR"] == "/mine"
    assert env.use_compile_cache(None)["env"]["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "other" / "inductor")


def test_trainer_uses_the_cache_beside_the_data_cache_and_reports_startup(fresh_env, tmp_path):
    from mhar.training import train as T
    from mhar.runs.config import load_run_config

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat.\n" * 400)
    cfg = load_run_config(None, ["model.preset=debug", f"data.corpus={corpus}",
                                 f"data.cache_dir={tmp_path / 'cache' / 'shards'}", "data.seq_len=32",
                                 "data.val_tokens=128", "train.steps=5", "train.global_batch=2", "train.micro_batch=2",
                                 "train.eval_every=5", "train.checkpoint_every=5", "train.device=cpu",
                                 "train.threads=1"])
    summary = T.train(cfg, tmp_path / "run", started=time.time() - 1.0)
    st = summary["startup"]
    assert st["compile_cache"] == str((tmp_path / "cache" / "compile" / "inductor").resolve())
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == st["compile_cache"] and os.environ["TRITON_CACHE_AUTOTUNING"] == "1"
    assert st["compile_cache_warm"] is False
    assert 1.0 <= st["first_step_s"] <= st["first_timed_step_s"]  # counted from `started` (1 s before the call)
