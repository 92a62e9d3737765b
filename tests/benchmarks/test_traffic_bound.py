"""The byte model of the fused routing and the throughput bound it implies (benchmarks/traffic_bound.py): the reads
it assumes are the reads a real model makes, its bytes follow from the kernels' loads and stores (counted twice,
independently), and the bound follows from bytes, bandwidth and baseline step."""
from __future__ import annotations

import csv

import pytest
import torch

from benchmarks import traffic_bound as tb
from benchmarks.common import microbatch
from benchmarks.traffic_bound import fused_bytes, min_bytes
from mhar.model.config import model_config
from mhar.model.presets import PRESETS
from mhar.model.transformer import Transformer


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
    cfg = PRESETS["1B"].model
    B, T = microbatch("1B")
    E = B * T * cfg["d_model"]
    n = 2 * cfg["n_layers"] + 1
    assert tb.unit_bytes("1B") == n * (n + 1) // 2 * E * 2  # sum of 1..N sources, bf16
    rows = [dict(size="1B", variant="baseline", step_ms="50", status="ok", gpu="G", torch="t", triton="tr"),
            dict(size="1B", variant="mhar_fused", step_ms="90", status="ok"),  # an older record's (withdrawn) kernels
            dict(size="1B", variant="mhar_fused_v7_sg8_pdl", step_ms="80", status="ok"),  # its name of today's fused
            dict(size="1B", variant="mhar_fused", step_ms="70", status="ok", routing_resolved="fused")]  # a new row
    hbm = 4000.0
    (r,) = tb.bound_rows(rows, hbm)
    mf, mb = min_bytes(tb.routing_reads(cfg["n_layers"]), E)
    assert r["min_gb"] == pytest.approx((mf + mb) / 1e9, abs=1e-3)
    ideal = (mf + mb) / (hbm * 1e9) * 1e3
    assert r["min_ideal_ms"] == pytest.approx(ideal, abs=0.01)
    assert r["min_bound_ratio"] == pytest.approx(50 / (50 + ideal), abs=1e-4)
    # no sharing at all: 2 units + dsr (H/D of a unit: bf16, written; its (H, reads, sources x tokens) buffer zeroed
    # and read whole by the one dW matmul) + 7 source sizes per read (1 output, 3 stash, 3 per source) + the sums of
    # squares (fp32 per token): read with each scored source, written by each append, read by each gradient
    unit = tb.unit_bytes("1B")
    tok = B * T
    ns = tb.routing_reads(cfg["n_layers"])
    plain = 2 * unit + unit * 1 * 8 / cfg["d_model"] + 7 * n * E * 2 + (sum(ns) + 2 * n) * tok * 4 \
        + 2 * n * n * tok * 8 * 2  # dL/dscore: written per (source, read), one buffer zeroed and read whole
    fwd1, bwd1 = fused_bytes(ns, E, 8, cfg["d_model"])
    assert fwd1 + bwd1 == pytest.approx(plain, rel=1e-12)
    # forward groups of 8: the forward reads each group's prefix once (+ partials), the backward is unchanged
    g = 8
    fwd_g = sum((ns[a] + 2 * g + sum(ns[i] - ns[a] + 1 for i in range(a, a + g))) * E * 2
                + sum(ns[i] - ns[a] for i in range(a, a + g)) * tok * 4 + ns[a] * tok * 4  # (the prefix's too)
                for a in range(0, n - 1, g)) + (ns[-1] + 1) * E * 2 + ns[-1] * tok * 4 \
        + n * tok * 4  # 9 groups of 8 + one plain read; the appends' sums of squares
    fg, bg = fused_bytes(ns, E, 8, cfg["d_model"], group=g)
    assert (fg, bg) == (pytest.approx(fwd_g, rel=1e-12), pytest.approx(bwd1, rel=1e-12))
    # what routing_impl fused moves at H = 8 (head width 160: source groups): fewer bytes than no sharing
    assert tb.fused_config(8, cfg["d_model"]) == dict(group=4, table=True, source_group=8)
    ff, fb = fused_bytes(ns, E, 8, cfg["d_model"], **tb.fused_config(8, cfg["d_model"]))
    assert r["fused_gb"] == pytest.approx((ff + fb) / 1e9, abs=1e-3) and r["fused_gb"] < r["min_gb"]
    # the measured ratio: the first row that ran today's fused path (an older record's mhar_fused_v7_sg8_pdl; its
    # mhar_fused rows measured withdrawn kernels)
    assert r["measured_variant"] == "mhar_fused_v7_sg8_pdl" and r["measured_gap_ms"] == 30
    assert r["measured_ratio"] == pytest.approx(50 / 80, abs=1e-4) and r["gpu"] == "G"
    (new,) = tb.bound_rows([rows[0], rows[3]], hbm)
    assert new["measured_variant"] == "mhar_fused" and new["measured_ratio"] == pytest.approx(50 / 70, abs=1e-4)
    # infinite bandwidth: no bound
    (r_inf,) = tb.bound_rows(rows, 1e12)
    assert r_inf["fused_bound_ratio"] == pytest.approx(1.0, abs=1e-4)


def test_fused_config_is_what_the_router_runs():
    """The byte model's options for routing_impl fused are the router's: table (none with a null source), forward
    groups of READ_GROUP, source groups up to SOURCE_GROUP_MAX_HEAD columns per head (H = 4 at 350M: no groups)."""
    from mhar.model.routing.fused import FusedRouter
    r = FusedRouter()
    assert tb.fused_config(8, 1280) == dict(group=r.group, table=r.table, source_group=r.source_group)
    assert tb.fused_config(4, 1024)["source_group"] == 1 and tb.fused_config(8, 512, null=True)["table"] is False


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
    from benchmarks.traffic_bound import _dout_passes

    ns = [1, 2, 3, 4, 5]
    assert _dout_passes(ns, 1) == (sum(ns), 0)  # one pass per source over every read that saw it
    assert _dout_passes(ns, 2) == (1 + 1 + 3 + 1 + 5, 4)
    assert _dout_passes(ns, 8) == (1 + 1 + 2 + 3 + 4, 5)  # one group of all five over read 4, then completions
    E, D = 1000, 10
    f1, b1 = fused_bytes(ns, E, 2, D)
    f2, b2 = fused_bytes(ns, E, 2, D, source_group=2)
    assert f1 == f2  # the forward is unchanged
    # 4 douts fewer; four partials: fp32 written and read back, the source read again, its sums of squares read,
    # its per-head RMS-term sums (2 heads, fp32) written and read
    assert b2 - b1 == -4 * E * 2 + 4 * (5 * E * 2 + (E // D) * 4 + 2 * (E // D) * 2 * 4)


def test_table_table_bytes_by_hand():
    """The score table's bytes: five reads over 1..5 sources. Scoring reads each source and
    its sums of squares once and writes one fp32 row of H per token for every read that sees it; a read then
    reads two rows per source (the max, the mix) instead of the sums of squares; the gradient kernel one row per
    (source, read). A group of K reads' prefix pass reads K rows per prefix source twice."""
    ns, E, D, H = [1, 2, 3, 4, 5], 1000, 10, 2
    tok, sb = E // D, (E // D) * H * 4
    f6, b6 = fused_bytes(ns, E, H, D)
    f7, b7 = fused_bytes(ns, E, H, D, table=True)
    assert f7 - f6 == 5 * (E * 2 + tok * 4) + sum(ns) * sb + sum(ns) * (2 * sb - tok * 4)
    assert b7 - b6 == sum(ns) * sb
    # groups of 2 (reads 0-1, 2-3, 4): prefix passes over 1 and 3 sources for 2 reads each; read 4 plain
    fg, _ = fused_bytes(ns, E, H, D, table=True, group=2)
    per_group = [(0, 2), (2, 2)]
    expect = 5 * tok * 4 + 5 * (E * 2 + tok * 4) + sum(ns) * sb
    for a, K in per_group:
        expect += (ns[a] + 2 * K + sum(ns[i] - ns[a] + 1 for i in range(a, a + K))) * E * 2 \
            + sum(ns[i] - ns[a] for i in range(a, a + K)) * 2 * sb + K * ns[a] * 2 * sb
    expect += (ns[4] + 1) * E * 2 + ns[4] * 2 * sb
    assert fg == expect


@pytest.mark.parametrize("size", ["100M", "350M", "1B"])
def test_kernel_bytes_agree_with_the_aggregate_model(size):
    """The per-kernel count of routing_impl fused (kernel by kernel, from the kernels' loads and stores) and the
    aggregate byte model (fused_bytes with the table, forward groups of 4, source groups of 8) are written
    independently; they differ only by what each leaves out (the append's copy; dsr's fill and dW matmul)."""
    cfg, (B, T) = PRESETS[size].model, microbatch(size)
    f, b = fused_bytes(tb.routing_reads(cfg["n_layers"]), B * T * cfg["d_model"], 8, cfg["d_model"], group=4,
                    source_group=8, table=True)
    total = sum(n for _, n in tb.kernel_bytes(size).values())
    assert abs(total / (f + b) - 1) < 0.02, (total, f + b)


def test_kernel_launches_match_the_h200_profile():
    """The launches per 1B step the model counts (73 reads: 18 prefix passes, 9 source-group passes, ...) are the
    launches torch.profiler saw on the H200 (results/bench/profile_train_1B.json, committed record)."""
    import json
    from pathlib import Path
    prof = json.load(open(Path(__file__).parents[2] / "results/bench/profile_train_1B.json"))
    # the record names two kernels as the profiler saw them then: _fwd7_kernel, _prefix7_kernel
    renamed = {"_fwd7_kernel": "_route_fwd_table_kernel", "_prefix7_kernel": "_prefix_fwd_table_kernel"}
    seen = {renamed.get(k, k): v for k, v in prof["results"]["mhar_fused_v7_sg8"]["kernels"].items()}
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




@pytest.mark.parametrize("size", ["100M", "350M", "1B"])
def test_two_phase_forward_is_the_grouped_path_without_the_table(size):
    """The two-phase forward, counted block by block, is what the byte model of the fused kernels gives for
    forward groups of S without the score table (``fused_bytes(group=S, table=False)``), at every S: two counts
    written independently."""
    cfg, (B, T) = PRESETS[size].model, microbatch(size)
    ns, E, D = tb.routing_reads(cfg["n_layers"]), B * T * cfg["d_model"], cfg["d_model"]
    for S in tb.BLOCK_SIZES:
        f, _ = fused_bytes(ns, E, 8, D, group=S, table=False)
        assert tb.two_phase_fwd_bytes(ns, E, D, S) == f, S
        f2, b2 = tb.two_phase_bytes(ns, E, 8, D, S)
        # the backward: fused's source-major one without the table's rows
        sg = tb.fused_config(8, D)["source_group"]
        assert f2 == f and b2 == fused_bytes(ns, E, 8, D, source_group=sg, table=False)[1]


def test_two_phase_bytes_by_hand():
    """Five reads over 1..5 sources, blocks of 2 (reads 0-1, 2-3, 4): phase 1 of block (0, 1) reads 1 source and
    writes 2 partials, phase 2 read 0: partial in, 0 newer, out; read 1: partial, 1 newer, out; block (2, 3): 3
    sources, 2 partials; read 2: partial + out; read 3: partial + 1 newer + out; read 4 alone: 5 sources + out. Every
    source read brings its sums of squares (fp32 per token), every append writes them."""
    ns, E, D = [1, 2, 3, 4, 5], 1000, 10
    e, ss = E * 2, (E // D) * 4
    expect = 5 * ss
    expect += (1 * (e + ss) + 2 * e) + (e + e) + (e + (e + ss) + e)
    expect += (3 * (e + ss) + 2 * e) + (e + e) + (e + (e + ss) + e)
    expect += 6 * e + 5 * ss
    assert tb.two_phase_fwd_bytes(ns, E, D, 2) == expect
    assert tb.two_phase_fwd_bytes(ns, E, D, 1) == sum((n + 1) * e + n * ss for n in ns) + 5 * ss  # no sharing


@pytest.mark.parametrize("variant", ["block_attnres", "open_attnres"])
def test_block_layout_reads_match_a_real_forward(variant):
    """The reads the block-layout model assumes are those of a real forward (4 layers, 3 blocks: uneven)."""
    blocks, L = 3, 4
    model = Transformer(model_config("debug", n_layers=L, residual={"variant": variant, "blocks": blocks,
                                                                     "routing_impl": "eager"}))
    res, seen = model.residual, []
    if variant == "block_attnres":
        orig = res.router.read

        def read(state, *a, **k):
            seen.append((res.router.num_sources(state), int(k.get("extra") is not None)))
            return orig(state, *a, **k)
        res.router.read = read
    else:
        orig = res._depth_read

        def read(state, i):
            seen.append((len(state.closed), 1))
            return orig(state, i)
        res._depth_read = read
    with torch.no_grad():
        model(torch.randint(0, model.cfg.vocab_size, (1, 8)))
    assert seen == tb.block_layout_reads(L, blocks, variant)


def test_block_layout_bytes_by_hand():
    """Reads (stored, transient): (1, 0), (1, 1), (2, 0), (2, 1), (3, 0). Per read: forward (s + x + 1) sources,
    backward (2 (s + x) + 1). Two-phase: runs of equal stored count (1: reads 0-1, 2: reads 2-3, 3: read 4)."""
    reads, E = [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0)], 1000
    e = 2 * E
    f, b = tb.block_layout_bytes(reads, E, False)
    assert (f, b) == ((2 + 3 + 3 + 4 + 4) * e, (3 + 5 + 5 + 7 + 7) * e)
    f, b = tb.block_layout_bytes(reads, E, True)
    # phase 1: run 1: 1 stored + 2 partials, run 2: 2 + 2, run 3 (one read): 3 stored, no partial; phase 2: each
    # read of a run of two reads its partial, its transient, writes out; read 4: out
    assert f == (3 + 4 + 3) * e + ((2 + 3) + (2 + 3) + 1) * e
    # phase 2: dout, out, (partial), 2 per transient; phase 1: 5 douts, 3 stored in, 3 gradients out
    assert b == ((4 + 6) + (4 + 6) + 3) * e + 5 * e + 6 * e


def test_two_phase_rows_bound_and_block_size():
    """Rows of the two-phase table: the bound follows from the bytes, the bandwidth and the baseline step; the
    chosen S has the fewest bytes; the block layouts' two-phase rows move fewer bytes than their per-read rows."""
    rows = tb.two_phase_rows({"350M": 40.0, "1B": 50.0}, 4000.0)
    assert {r["size"] for r in rows} == {"350M", "1B"}
    for r in rows:
        ideal = r["gb"] * 1e9 / 4000e9 * 1e3
        assert r["ideal_ms"] == pytest.approx(ideal, abs=1e-3)
        assert r["bound_ratio"] == pytest.approx(r["base_ms"] / (r["base_ms"] + ideal), abs=1e-4)
    best = tb.best_block_size(rows)
    for size, S in best.items():
        tp = [r for r in rows if r["size"] == size and r["layout"] == "mhar" and r["algorithm"] == "two_phase"]
        assert min(tp, key=lambda r: r["gb"])["S"] == S
        assert [r["S"] for r in tp] == list(tb.BLOCK_SIZES)
    for size in best:
        for layout in ("block_attnres", "open_attnres"):
            per, two = (next(r for r in rows if r["size"] == size and r["layout"] == layout and r["algorithm"] == a)
                        for a in ("per_read", "two_phase"))
            assert two["gb"] < per["gb"]


def test_two_phase_cli(tmp_path, capsys):
    training = tmp_path / "training.csv"
    with training.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["size", "variant", "step_ms", "status"])
        w.writeheader()
        w.writerow(dict(size="1B", variant="baseline", step_ms="50", status="ok"))
    out = tmp_path / "tp.csv"
    assert tb.main(["--training", str(training), "--hbm-gbps", "4000", "--two-phase", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert {r["size"] for r in rows} == {"1B"} and rows[0]["command"].endswith(f"--two-phase {out}")
    assert "fewest bytes: S = {'1B': 8}" in capsys.readouterr().out
    training.write_text("size,variant,step_ms,status\n1B,mhar_fused,50,ok\n")
    assert tb.main(["--training", str(training), "--hbm-gbps", "4000", "--two-phase", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error:")
