"""The traffic model behind the fused-routing throughput bound (benchmarks/traffic_bound.py): the reads it
assumes are the reads a real model makes, and the bound follows from bytes, bandwidth and baseline step."""
from __future__ import annotations

import csv
import os

import pytest
import torch

from benchmarks import traffic_bound as tb
from benchmarks.bench_routing_op import MICROBATCH, min_bytes, v6_bytes
from mhar.config import PRESETS, model_config
from mhar.model import Transformer


@pytest.mark.parametrize("variant,heads", [("mhar", 4), ("attnres", 1)])
def test_routing_reads_match_a_real_forward(variant, heads):
    model = Transformer(model_config("debug", residual={"variant": variant, "heads": heads, "routing_impl": "eager"}))
    seen = []
    routers = {id(m.router): m.router for m in model.modules() if hasattr(m, "router")}
    assert routers, "no routed residual found"
    for r in routers.values():
        orig = r.read

        def read(state, *a, _orig=orig, _r=r, **k):
            seen.append(_r.num_sources(state) + (k.get("extra") is not None))
            return _orig(state, *a, **k)
        r.read = read
    with torch.no_grad():
        model(torch.randint(0, model.cfg.vocab_size, (1, 8)))
    assert seen == tb.routing_reads(model.cfg.n_layers)


def test_unit_bytes_and_bounds():
    cfg = PRESETS["1B"]
    B, T = MICROBATCH["1B"]
    E = B * T * cfg["d_model"]
    n = 2 * cfg["n_layers"] + 1
    assert tb.unit_bytes("1B") == n * (n + 1) // 2 * E * 2  # sum of 1..N sources, bf16
    rows = [dict(size="1B", variant="baseline", step_ms="50", status="ok", gpu="G", torch="t", triton="tr"),
            dict(size="1B", variant="mhar_fused_sub", step_ms="80", status="ok")]
    hbm = 4000.0
    (r,) = tb.bound_rows(rows, hbm)
    ideal = 4 * tb.unit_bytes("1B") / (hbm * 1e9) * 1e3
    assert r["v5_ideal_ms"] == pytest.approx(ideal, abs=0.01)
    assert r["v5_bound_ratio"] == pytest.approx(50 / (50 + ideal), abs=1e-4)
    mf, mb = min_bytes(tb.routing_reads(cfg["n_layers"]), E)
    assert r["min_gb"] == pytest.approx((mf + mb) / 1e9, abs=1e-3) and r["min_gb"] < r["v5_gb"]
    # v6: 2 units + dsr (H/D of a unit: bf16, written; its (H, reads, sources x tokens) buffer zeroed and read whole
    # by the one dW matmul) + 7 source sizes per read (1 output, 3 stash,
    # 3 per source) + the sums of squares (fp32 per token): read with each scored source, written by each append,
    # read by each gradient
    unit = tb.unit_bytes("1B")
    tok = B * T
    ns = tb.routing_reads(cfg["n_layers"])
    v6 = 2 * unit + unit * 1 * 8 / cfg["d_model"] + 7 * n * E * 2 + (sum(ns) + 2 * n) * tok * 4 \
        + 2 * n * n * tok * 8 * 2  # dL/dscore: written per (source, read), one buffer zeroed and read whole
    assert r["v6_gb"] == pytest.approx(v6 / 1e9, abs=1e-3)
    fwd6, bwd6 = v6_bytes(ns, E, 8, cfg["d_model"])
    assert fwd6 + bwd6 == pytest.approx(v6, rel=1e-12)
    assert r["v6_gb"] < r["min_gb"] < r["v5_gb"] and r["v5_bound_ratio"] < r["v6_bound_ratio"]
    # forward groups of 8: the forward reads each group's prefix once (+ partials), the backward is unchanged
    g = tb.V6_GROUP
    fwd_g = sum((ns[a] + 2 * g + sum(ns[i] - ns[a] + 1 for i in range(a, a + g))) * E * 2
                + sum(ns[i] - ns[a] for i in range(a, a + g)) * tok * 4
                for a in range(0, n - 1, g)) + (ns[-1] + 1) * E * 2 + ns[-1] * tok * 4 \
        + n * tok * 4  # 9 groups of 8 + one plain read; the appends' sums of squares
    fwd_1 = unit + n * E * 2 + (sum(ns) + n) * tok * 4  # the forward without sharing (sources, outputs, ss)
    assert r["v6_g8_gb"] == pytest.approx((v6 - fwd_1 + fwd_g) / 1e9, abs=1e-3)
    fg, bg = v6_bytes(ns, E, 8, cfg["d_model"], group=g)
    assert (fg, bg) == (pytest.approx(fwd_g, rel=1e-12), pytest.approx(bwd6, rel=1e-12))
    assert r["v6_g8_gb"] < r["v6_gb"]
    assert r["measured_ratio"] == pytest.approx(50 / 80, abs=1e-4) and r["measured_gap_ms"] == 30
    assert r["gpu"] == "G"
    # infinite bandwidth: no bound
    (r_inf,) = tb.bound_rows(rows, 1e12)
    assert r_inf["v5_bound_ratio"] == pytest.approx(1.0, abs=1e-4)


def test_cli_writes_provenance_and_refuses_missing_input(tmp_path, capsys):
    training = tmp_path / "training.csv"
    with training.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["size", "variant", "step_ms", "status", "gpu", "torch", "triton"])
        w.writeheader()
        w.writerow(dict(size="100M", variant="baseline", step_ms="36", status="ok", gpu="G", torch="t", triton="tr"))
    out = tmp_path / "bound.csv"
    assert tb.main(["--training", str(training), "--hbm-gbps", "4000", "--out", str(out)]) == 0
    (row,) = csv.DictReader(out.open())
    assert row["size"] == "100M" and row["measured_ratio"] == "" and row["command"].endswith(f"--out {out}")
    assert tb.main(["--training", str(tmp_path / "none.csv"), "--hbm-gbps", "1", "--out", str(out)]) == 2
    assert "not found" in capsys.readouterr().err


def test_source_group_dout_passes_by_hand():
    """Five reads over 1..5 sources (read k first sees slot k), source groups of 2, backward newest first:
    read 4 forms slots 4 and 3's parts over read 4 (1 dout; slot 4 completed at once, no reads), read 3
    completes slot 3 (1), read 2 forms slots 2 and 1 over reads 2..4 (3), read 1 completes slot 1 (1), read 0
    forms slot 0 alone (5). Every member of a group has a part (the newest too: its RMS term needs all heads)."""
    from benchmarks.bench_routing_op import _dout_passes

    ns = [1, 2, 3, 4, 5]
    assert _dout_passes(ns, 1) == (sum(ns), 0)  # one pass per source over every read that saw it
    assert _dout_passes(ns, 2) == (1 + 1 + 3 + 1 + 5, 4)
    assert _dout_passes(ns, 8) == (1 + 1 + 2 + 3 + 4, 5)  # one group of all five over read 4, then completions
    # defer 1: read 4 forms {3, 4} as before (1); read 3 completes 3 (1) and starts {1, 2} over reads 3..4 (2);
    # read 2 completes 2 over read 2 (1), read 1 completes 1 over reads 1..2 (2), read 0 alone (5)
    assert _dout_passes(ns, 2, 1) == (1 + 1 + 2 + 1 + 2 + 5, 4)
    E, D = 1000, 10
    f1, b1 = v6_bytes(ns, E, 2, D)
    f2, b2 = v6_bytes(ns, E, 2, D, source_group=2)
    assert f1 == f2  # the forward is unchanged
    # 4 douts fewer; four partials: fp32 written and read back, the source read again, its sums of squares read,
    # its per-head RMS-term sums (2 heads, fp32) written and read
    assert b2 - b1 == -4 * E * 2 + 4 * (5 * E * 2 + (E // D) * 4 + 2 * (E // D) * 2 * 4)


def test_op_bench_names_v6_options():
    """bench_routing_op's impl names for the v6 options: fused_sgG, fused_gK, fused_gK_sgG (byte model too)."""
    from benchmarks.bench_routing_op import _router, _v6_options, model_bytes

    r = _router("fused_g8_sg4")
    assert (r.group, r.source_group, r.name) == (8, 4, "fused_sg4")
    assert _router("fused_sg2").source_group == 2 and _router("fused_g3").group == 3
    with pytest.raises(ValueError, match="unknown routing implementation"):
        _v6_options("fused_x4")
    ns, E, D = [1, 2, 3, 4, 5, 6, 7, 8, 9], 4000, 40
    assert model_bytes("fused_g4_sg2", ns, E, 2, D) == v6_bytes(ns, E, 2, D, group=4, source_group=2)


def test_every_v6_option_reaches_the_byte_model():
    """model_bytes takes every v6 / v7 option _v6_options parses (fused_t_g4_sg8_ts crashed the 1B routing op
    bench on the H200, session 2026-12-02f: v6_bytes did not take group_scores); the table-score group pass
    moves row reads between kernels, not their number."""
    from benchmarks.bench_routing_op import model_bytes

    ns, E, D, H = [1, 2, 3, 4, 5, 6, 7, 8, 9], 4000, 40, 2
    ts = model_bytes("fused_t_g4_sg8_ts", ns, E, H, D)
    assert ts == model_bytes("fused_t_g4_sg8", ns, E, H, D) == v6_bytes(ns, E, H, D, table=True, group=4,
                                                                        source_group=8)


def test_v7_table_bytes_by_hand():
    """The score table's bytes (fused_t*, fused_v7): five reads over 1..5 sources. Scoring reads each source and
    its sums of squares once and writes one fp32 row of H per token for every read that sees it; a read then
    reads two rows per source (the max, the mix) instead of the sums of squares; the gradient kernel one row per
    (source, read). A group of K reads' prefix pass reads K rows per prefix source twice."""
    from benchmarks.bench_routing_op import _router, model_bytes

    ns, E, D, H = [1, 2, 3, 4, 5], 1000, 10, 2
    tok, sb = E // D, (E // D) * H * 4
    f6, b6 = v6_bytes(ns, E, H, D)
    f7, b7 = v6_bytes(ns, E, H, D, table=True)
    assert f7 - f6 == 5 * (E * 2 + tok * 4) + sum(ns) * sb + sum(ns) * (2 * sb - tok * 4)
    assert b7 - b6 == sum(ns) * sb
    # groups of 2 (reads 0-1, 2-3, 4): prefix passes over 1 and 3 sources for 2 reads each; read 4 plain
    fg, _ = v6_bytes(ns, E, H, D, table=True, group=2)
    per_group = [(0, 2), (2, 2)]
    expect = 5 * tok * 4 + 5 * (E * 2 + tok * 4) + sum(ns) * sb
    for a, K in per_group:
        expect += (ns[a] + 2 * K + sum(ns[i] - ns[a] + 1 for i in range(a, a + K))) * E * 2 \
            + sum(ns[i] - ns[a] for i in range(a, a + K)) * 2 * sb + K * ns[a] * 2 * sb
    expect += (ns[4] + 1) * E * 2 + ns[4] * 2 * sb
    assert fg == expect
    r = _router("fused_t_g4")
    assert (r.table, r.group, r.name) == (True, 4, "fused_v7")
    assert model_bytes("fused_t_g2", ns, E, H, D) == v6_bytes(ns, E, H, D, table=True, group=2)


def test_prenorm_row_removes_the_fused_norm_passes():
    """v7_g4_sg8_norm: the v7_g4_sg8 routing bytes minus, per SUBLAYER read (not the final readout), the norm's
    backward dh write + its read back + the second read of h, and the forward norm's read of the mix: 4 sources'
    bytes each."""
    cfg = PRESETS["350M"]
    B, T = MICROBATCH["350M"]
    E = B * T * cfg["d_model"]
    rows = [dict(size="350M", variant="baseline", step_ms="40", status="ok")]
    (r,) = tb.bound_rows(rows, 4000.0)
    saved = 4 * (2 * cfg["n_layers"]) * E * 2
    assert r["v7_g4_sg8_norm_gb"] == pytest.approx(r["v7_g4_sg8_gb"] - saved / 1e9, abs=2e-3)
    assert r["v7_g4_sg8_norm_bound_ratio"] > r["v7_g4_sg8_bound_ratio"]


@pytest.mark.parametrize("size", ["100M", "350M", "1B"])
def test_kernel_bytes_agree_with_the_aggregate_model(size):
    """The per-kernel count of fused_v7_sg8 (kernel by kernel, from the kernels' loads and stores) and the
    aggregate byte model (v6_bytes with the table, forward groups of 4, source groups of 8) are written
    independently; they differ only by what each leaves out (the append's copy; dsr's fill and dW matmul)."""
    cfg, (B, T) = PRESETS[size], MICROBATCH[size]
    f, b = v6_bytes(tb.routing_reads(cfg["n_layers"]), B * T * cfg["d_model"], 8, cfg["d_model"], group=4,
                    source_group=8, table=True)
    total = sum(n for _, n in tb.kernel_bytes(size).values())
    assert abs(total / (f + b) - 1) < 0.02, (total, f + b)


def test_kernel_launches_match_the_h200_profile():
    """The launches per 1B step the model counts (73 reads: 18 prefix passes, 9 source-group passes, ...) are the
    launches torch.profiler saw on the H200 (results/bench/profile_train_1B.json, committed record)."""
    import json
    from pathlib import Path
    prof = json.load(open(Path(__file__).parents[1] / "results/bench/profile_train_1B.json"))
    seen = prof["results"]["mhar_fused_v7_sg8"]["kernels"]
    model = tb.kernel_bytes("1B")
    assert {k: round(seen[k][1]) for k in model} == {k: c for k, (c, _) in model.items()}


def test_profile_cli_prints_each_kernels_fraction_of_hbm(tmp_path, capsys):
    import json
    model = tb.kernel_bytes("350M")
    ms = {k: 0.5 + i / 10 for i, k in enumerate(model)}
    prof = {"kind": "train", "size": "350M", "results": {
        "baseline": {"kernels": {"gemm": [1.0, 3]}},
        "mhar_fused_v7_sg8": {"kernels": {k: [ms[k], model[k][0]] for k in model}}}}
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    assert tb.main(["--profile", str(path), "--hbm-gbps", "4000"]) == 0
    out = capsys.readouterr().out
    for k, (calls, nbytes) in model.items():
        line = next(l for l in out.splitlines() if l.strip().startswith(k))
        f = line.split()
        assert int(f[1]) == calls and float(f[5]) == pytest.approx(nbytes / ms[k] / 1e6 / 4000, abs=0.006), line
    assert "baseline" not in out
    path.write_text("{not json")
    assert tb.main(["--profile", str(path), "--hbm-gbps", "4000"]) == 2
    assert capsys.readouterr().err.startswith("error:")
    assert tb.main(["--profile", str(tmp_path / "none.json"), "--hbm-gbps", "4000"]) == 2
    assert "not found" in capsys.readouterr().err


def test_op_bench_pdl_names_run_the_same_kernels_with_pdl_on(monkeypatch):
    """``fused_t_g4_sg8_pdl``: the kernels of ``fused_t_g4_sg8`` (router, byte model) timed with
    MHAR_ROUTING_PDL=1, and ``fused_t_g4_sg8`` with MHAR_ROUTING_PDL=0 (PDL is the library's default on sm_90+);
    the caller's setting is restored afterwards; the row names the impl as asked and its kernel settings."""
    from benchmarks import bench_routing_op as B

    name, env = B.impl_settings("fused_t_g4_sg8_pdl")
    assert (name, env["MHAR_ROUTING_PDL"]) == ("fused_t_g4_sg8", "1")
    name, env = B.impl_settings("fused_t_g4_sg8")
    assert (name, env["MHAR_ROUTING_PDL"]) == ("fused_t_g4_sg8", "0")
    name, env = B.impl_settings("fused_t_g4_sg8_heads_pdl")
    assert name == "fused_t_g4_sg8" and env == {"MHAR_ROUTING_PDL": "1", "MHAR_ROUTING_SCORE": "heads"}
    assert B.impl_settings("fused_t_g4_sg8_heads") == ("fused_t_g4_sg8", {
        "MHAR_ROUTING_PDL": "0", "MHAR_ROUTING_SCORE": "heads"})
    assert B.impl_settings("eager") == ("eager", {})
    monkeypatch.delenv("MHAR_ROUTING_PDL", raising=False)
    seen = []

    def fake(c, impl, mode, graph=False):
        seen.append((impl, os.environ.get("MHAR_ROUTING_PDL")))
        return {"impl": impl}
    monkeypatch.setattr(B, "_bench_case", fake)
    c = B.Case("debug", 2, 64, 64, 2, 5)
    r1 = B.bench_case(c, "fused_t_g4_sg8_pdl", "microbatch")
    r0 = B.bench_case(c, "fused_t_g4_sg8", "microbatch")
    re_ = B.bench_case(c, "eager", "microbatch")
    assert seen == [("fused_t_g4_sg8", "1"), ("fused_t_g4_sg8", "0"), ("eager", None)]
    assert "MHAR_ROUTING_PDL" not in os.environ
    assert r1["impl"] == "fused_t_g4_sg8_pdl" and "MHAR_ROUTING_PDL=1" in r1["routing_env"]
    assert r0["impl"] == "fused_t_g4_sg8" and "MHAR_ROUTING_PDL=0" in r0["routing_env"]
    assert "MHAR_ROUTING_PDL" not in re_["routing_env"]
    monkeypatch.setenv("MHAR_ROUTING_PDL", "1")  # the caller's setting comes back after a case
    B.bench_case(c, "fused_t_g4_sg8", "microbatch")
    assert seen[-1] == ("fused_t_g4_sg8", "0") and os.environ["MHAR_ROUTING_PDL"] == "1"


def test_async_scores_byte_model_by_hand():
    """fused_t_g4_sg8_async: every group after the first stops its prefix one source early, so each of its K reads
    reads that source itself, and every read scores the sources after its prefix itself (their sums of squares
    instead of table rows)."""
    from benchmarks.bench_routing_op import model_bytes

    ns, E, D, H = [1, 2, 3, 4, 5, 6, 7, 8], 4000, 40, 2
    elt, ss, sb = 2, (E // D) * 4, (E // D) * H * 4
    f0, b0 = model_bytes("fused_t_g4_sg8", ns, E, H, D)
    f1, b1 = model_bytes("fused_t_g4_sg8_async", ns, E, H, D)
    assert b1 == b0
    # one later group (reads 4..7 over 5..8 sources, K = 4): the prefix reads 4 sources instead of 5 (-1 row) and
    # the reads 2 + 3 + 4 + 5 = 14 rows after it instead of 1 + 2 + 3 + 4 = 10 (+4 rows); those 14 - 4 = 10 sources
    # are scored by each read itself (their sums of squares) where 6 took two score rows each from the table;
    # the prefix kernel reads the table for 4 sources, not 5 (-4 reads x 2 rows)
    assert f1 - f0 == 3 * E * elt + 10 * ss - 6 * 2 * sb - 4 * 2 * sb


def test_op_bench_names_async_scores():
    """bench_routing_op's ``fused_t_g4_sg8_async`` is the router of routing_impl fused_v7_sg8_async."""
    from benchmarks.bench_routing_op import _router

    r = _router("fused_t_g4_sg8_async")
    assert (r.table, r.group, r.source_group, r.async_scores) == (True, 4, 8, True)
    assert not _router("fused_t_g4_sg8").async_scores


def test_op_bench_names_deferred_groups():
    """``fused_t_g4_sg8_async_df1`` is routing_impl fused_v7_sg8_overlap's router; its byte model is the deferred
    passes' (more douts in the completions than without deferral, the forward as with async scoring alone)."""
    from benchmarks.bench_routing_op import _router, model_bytes

    r = _router("fused_t_g4_sg8_async_df1")
    assert (r.async_scores, r.defer_groups, r.group, r.source_group, r.table) == (True, 1, 4, 8, True)
    ns, E, D, H = list(range(1, 26)), 4000, 40, 2
    fa, ba = model_bytes("fused_t_g4_sg8_async", ns, E, H, D)
    fo, bo = model_bytes("fused_t_g4_sg8_async_df1", ns, E, H, D)
    assert fo == fa and bo > ba
