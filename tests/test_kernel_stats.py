"""The v6 routing kernels, compiled for sm_90 without a GPU (benchmarks/kernel_stats.py): their source / read
loops are software-pipelined (cp.async into shared memory: the change that lifted the routing op by 1.1-1.5x on
the H200) and the configuration the H200 picked at 1B width (one token, 8 warps) stays free of spills with a
register count that leaves room for occupancy (the kernel before had 127 registers: 25% occupancy)."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def _stats(size: str, kernels: tuple) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-W", "ignore", "-m", "benchmarks.kernel_stats", "--json", "--sizes", size,
                        "--kernels", *kernels],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    if p.returncode != 0 and ("ptxas" in p.stderr or "No such file" in p.stderr):
        pytest.skip(f"no ptxas for sm_90 in this Triton: {p.stderr[-300:]}")
    assert p.returncode == 0, p.stderr[-2000:]
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def test_v6_kernels_pipelined_and_lean_at_1b_width():
    rows = _stats("1B", ("fwd6", "src_bwd", "group8_bwd"))
    assert {(r["kernel"], r["BLOCK_T"], r["STAGES"], r["warps"]) for r in rows} >= {
        ("fwd6", 1, 4, 8), ("src_bwd", 1, 4, 8), ("fwd6", 2, 2, 4), ("src_bwd", 4, 2, 8)}
    for r in rows:
        assert r["cp_async"] > 0 or r["STAGES"] == 1, f"loop not pipelined: {r}"
    for r in rows:
        if r["BLOCK_T"] == 1 and r["warps"] == 8 and r["kernel"] in ("fwd6", "src_bwd"):
            assert r["spill_bytes"] == 0 and r["registers"] <= 96, r
        if r["kernel"] == "src_bwd" and r["BLOCK_T"] == 1:
            # rows as two tiles (head width 160 = 128 + 32): the pipeline stages hold a read's D = 1280 columns
            # (dout bf16 + w fp32), not 8 x 256 padded lanes (37% idle: measured issue-bound on the H200;
            # the padded kernel staged 12.4 / 37.2 KB at 2 / 4 stages)
            assert r["shared_bytes"] <= (r["STAGES"] - 1) * 1280 * (2 + 4) + 1024, r
    # the source-group kernel (8 sources per pass, tensor-core dots) has spill-free configurations at 1B width
    assert any(r["spill_bytes"] == 0 for r in rows if r["kernel"] == "group8_bwd"), rows


def test_score_and_prenorm_kernels_compile_without_spills_at_1b_width():
    """The scoring kernel's launches (64 tokens x 8 warps for 64 reads, 32 x 4 for 128: the 1B model's two
    largest tiles) and every pre-norm launch the autotuner may pick compile for sm_90 without spills at the 1B
    width. The pre-norm stash's loop issues more than the ~16 instructions per element an SM can issue at full
    bandwidth (22.9+ with Triton 3.9): a likely reason why fusing the pre-norm gained nothing on the H200
    (results/bench/NOTES.md)."""
    rows = _stats("1B", ("score_64", "score_128", "prenorm_fwd", "prenorm_stash"))
    score = {(r["kernel"], r["BLOCK_T"], r["warps"]) for r in rows if r["kernel"].startswith("score_")}
    assert score == {("score_64", 64, 8), ("score_128", 32, 4)}, score
    assert all(r["spill_bytes"] == 0 for r in rows), [r for r in rows if r["spill_bytes"]]
    stash = [r["instr_per_element"] for r in rows if r["kernel"] == "prenorm_stash"]
    assert stash and min(stash) > 16, stash


_AT_350M = ("fwd6", "src_bwd", "fwd7", "src_bwd_table", "prefix7_4", "group8_bwd",
            "group8_bwd_table")  # (one compile run, four tests)


def test_gradient_loop_issue_cost_at_350m_width():
    """The write-once gradient kernel is issue-bound on the H200 (Nsight Compute: 15.4 SASS instructions per
    loaded dout element at 63% of the issue slots, 0.51 of HBM bandwidth; results/gpu/session_2026-12-01e):
    its read loop must stay below the 15.3-15.6 instructions per element of the kernel before D / H / DH became
    compile-time constants and its gradient update two separate multiply-adds (Triton 3.9 / 3.6)."""
    rows = {(r["kernel"], r["BLOCK_T"], r["STAGES"], r["warps"]): r for r in _stats("350M", _AT_350M)}
    r = rows[("src_bwd", 2, 2, 4)]  # the configuration the H200 picked for most sources at 350M
    assert 0 < r["instr_per_element"] <= 14.75, r
    assert r["loop_instructions"] > 100, r  # (the loop found is the read loop, not a short helper loop)


def test_v7_kernels_within_the_issue_budget_at_350m_width():
    """The score table removes the per-read score dot product: the v7 forward loop issues fewer instructions per
    element than v6's in the same launch configuration, the gradient loop too, and the prefix kernel (4 reads
    mixed per pass) has a configuration under the ~16 instructions per element at which an SM no longer keeps
    up with HBM (8.2 bf16 elements per SM-cycle at 4273 GB/s, 128 thread-instructions per cycle)."""
    rows = {(r["kernel"], r["BLOCK_T"], r["STAGES"], r["warps"]): r for r in _stats("350M", _AT_350M)}
    for new, old in (("fwd7", "fwd6"), ("src_bwd_table", "src_bwd")):
        a, b = rows[(new, 2, 2, 4)], rows[(old, 2, 2, 4)]
        assert 0 < a["instr_per_element"] < b["instr_per_element"], (a, b)
    assert rows[("fwd7", 2, 2, 4)]["instr_per_element"] <= 8, rows[("fwd7", 2, 2, 4)]
    p4 = [r for k, r in rows.items() if k[0] == "prefix7_4"]
    assert p4 and min(r["instr_per_element"] for r in p4) <= 16, p4
    assert all(r["spill_bytes"] == 0 for r in p4)


def test_source_group_kernel_costs_a_fraction_of_the_write_once_kernel_per_source():
    """The source-group gradient kernel forms every per-element product of its 8 sources with a loaded dout
    element on tensor cores (scores, x . dout, a @ dout, dsr @ w): its loop issues at most a quarter of the
    write-once kernel's instructions per (source, dout element) in its best configuration at 350M width. The
    CUDA-core group kernel it replaced needed 48-72 per dout element for 4 sources (12-18 per source: slower
    than one pass per source on the H200, session 2026-12-01d)."""
    rows = {(r["kernel"], r["BLOCK_T"], r["STAGES"], r["warps"]): r for r in _stats("350M", _AT_350M)}
    single = rows[("src_bwd", 2, 2, 4)]["instr_per_element"]
    group = [r for k, r in rows.items() if k[0] == "group8_bwd"]
    assert group, rows.keys()
    best = min(r["instr_per_element"] for r in group) / 8
    assert 0 < best <= single / 4, (best, single)
    assert any(r["spill_bytes"] == 0 for r in group)


def test_refuses_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=REPO)
    p = subprocess.run([sys.executable, "-m", "benchmarks.kernel_stats", "--sizes", "1B"], capture_output=True,
                       text=True, env=env, cwd=REPO, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("error:")


def test_group_pass_with_table_scores_issues_fewer_instructions():
    """routing_impl "fused_v7_sg8_ts": the source-group kernel reading each score from the v7 table (no x . w
    dots) issues fewer loop instructions per dout element than the recomputing kernel, in its best spill-free
    configuration and in each configuration both compile without spills (350M width)."""
    rows = {(r["kernel"], r["BLOCK_T"], r["STAGES"], r["warps"]): r for r in _stats("350M", _AT_350M)}
    plain = {k[1:]: r for k, r in rows.items() if k[0] == "group8_bwd"}
    table = {k[1:]: r for k, r in rows.items() if k[0] == "group8_bwd_table"}
    assert plain and plain.keys() == table.keys()
    clean = [k for k in plain if plain[k]["spill_bytes"] == 0 and table[k]["spill_bytes"] == 0]
    assert clean and all(table[k]["instr_per_element"] < plain[k]["instr_per_element"] for k in clean), clean
    assert min(table[k]["instr_per_element"] for k in clean) < min(plain[k]["instr_per_element"] for k in clean)
