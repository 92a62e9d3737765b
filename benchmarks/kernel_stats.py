"""Compile the routing kernels (v6 / v7 forward, gradient, source-group, prefix, scoring and pre-norm kernels) for
the H100/H200 (sm_90) without a GPU and report what decides their speed:
registers per thread, spills, shared memory, whether the source / read loop is software-pipelined
(``cp.async`` copies into shared memory in the PTX), and the loop's issue cost: SASS instructions per loaded
element (per thread). The H200 streams about 8 bf16 elements per SM and cycle at full HBM bandwidth and issues
at most 128 thread-instructions per SM and cycle, so a loop above ~16 instructions per element cannot keep up
with memory (Nsight Compute measured 15.4 for the 350M gradient kernel, which ran at 0.51 of peak bandwidth
at 63% of the issue slots: results/gpu/session_2026-12-01e).

    PYTHONPATH=. python -m benchmarks.kernel_stats                  # every v6 launch configuration, the presets
    PYTHONPATH=. python -m benchmarks.kernel_stats --json           # the same as JSON lines

Uses Triton's own compiler and the ``ptxas`` it ships (``ptxas -v`` for registers and spills). With the
device's Triton version the numbers are the device's: Triton 3.6 here reported 127 registers for the kernel
that Nsight Compute measured at 127 on the H200 (results/gpu/session_2026-12-01c). Integer arguments that are
multiples of 16 (D, head width, strides) are marked divisible by 16, as Triton's launcher does. Needs the
compiled (not interpreted) Triton: it refuses to run under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# (d_model, heads) of the presets the paper trains, H = 8 (the benchmarks' MHAR)
WIDTHS = {"100M": (512, 8), "350M": (1024, 8), "1B": (1280, 8)}


def _jit(kernel):
    import triton
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return kernel


def _sass_loop(cubin: bytes) -> list[str]:
    """The instructions (SASS, ``nvdisasm``) of the cubin's longest loop: the one ending in the backward branch
    that spans the most instructions (the source / read loop of the routing kernels)."""
    import triton
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    labels, pending, ins = {}, [], []
    for line in text.splitlines():
        lab = re.match(r"^\s*(\.L_\w+):", line)
        if lab:
            pending.append(lab.group(1))
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            labels.update((p, addr) for p in pending)
            pending = []
            ins.append((addr, m.group(2).strip()))
    best: list[str] = []
    for addr, txt in ins:
        br = re.search(r"BRA\s.*?\((\.L_\w+)\)", txt)
        if br and labels.get(br.group(1), addr + 1) <= addr:
            body = [t for a, t in ins if labels[br.group(1)] <= a <= addr]
            best = body if len(body) > len(best) else best
    return best


def compile_stats(kernel, types: dict, consts: dict, num_warps: int, divisible=()) -> dict:
    """Compile ``kernel`` (a JIT function, possibly wrapped by the autotuner) for sm_90 with the given argument
    types (default i32; pointers '*bf16' etc.), constexpr values and warps; return registers, spills (bytes),
    shared memory (bytes), the number of cp.async instructions in the PTX and the SASS instructions of the
    longest loop per warp and iteration (``loop_instructions``; the issue slots one iteration costs)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas

    fn = _jit(kernel)
    names = fn.arg_names
    sig = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if n not in consts and (n.endswith("_ptr") or n in divisible)}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs,
                                    constexprs={(names.index(k),): v for k, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", path, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True, check=True)
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spill = re.search(r"(\d+) bytes spill stores", res.stderr)
    return {"registers": int(regs.group(1)) if regs else None, "spill_bytes": int(spill.group(1)) if spill else 0,
            "shared_bytes": compiled.metadata.shared, "cp_async": ptx.count("cp.async."),
            "loop_instructions": len(_sass_loop(compiled.asm["cubin"]))}


def _score_config(K, KP: int):
    """The scoring kernel's one launch for a tile of KP reads (``score_launch``: not autotuned) as a Config."""
    import triton
    block_t, warps = K.score_launch(KP)
    return triton.Config({"BLOCK_T": block_t}, num_warps=warps)


def v6_stats(size: str, group: int = 8, prefix: int = 8, kernels=None) -> list[dict]:
    """Stats of the v6 forward, forward prefix (``prefix`` reads, one head per program), write-once gradient
    and source-group gradient (``group`` sources) kernels for every launch configuration the autotuner may pick
    (after its pruning) at a preset's width (bf16 sources)."""
    import triton

    from mhar.routing import _kernels as K

    D, H = WIDTHS[size]
    HP, DHP = K._tiles(D, H)  # the group / prefix kernels: a head padded to a power of two
    _, DA, DB = K._split(D, H)  # the forward / write-once gradient: a head as two power-of-two parts
    fwd_types = {n: "*bf16" for n in _jit(K._fwd6_kernel).arg_names if n.endswith("_ptr")}
    fwd_types.update(ss_ptr="*fp32", lse_ptr="*fp32", q_ptr="*fp32", g_ptr="*fp32", score_ptr="*fp32",
                     init_lse_ptr="*fp32", eps="fp32")
    bwd_types = {n: "*bf16" for n in _jit(K._src_bwd_kernel).arg_names if n.endswith("_ptr")}
    bwd_types.update(ss_ptr="*fp32", lse_ptr="*fp32", delta_ptr="*fp32", w_ptr="*fp32", dsr_ptr="*fp32",
                     cinit_ptr="*fp32", eps="fp32")
    pn_types = {n: "*bf16" for n in (*_jit(K._prenorm_fwd_kernel).arg_names, *_jit(K._prenorm_stash_kernel).arg_names)
                if n.endswith("_ptr")}  # (the norm weight and the fp32 outputs below; eps the norm's)
    pn_types.update(w_ptr="*fp32", rstd_ptr="*fp32", delta_ptr="*fp32", dw_part_ptr="*fp32", eps="fp32")
    sc_types = {n: "*bf16" for n in _jit(K._score_kernel).arg_names if n.endswith("_ptr")}
    sc_types.update(ss_ptr="*fp32", s_ptr="*fp32", eps="fp32")
    sh_types = {n: "*bf16" for n in _jit(K._score_heads_kernel).arg_names if n.endswith("_ptr")}
    sh_types.update(ss_ptr="*fp32", s_ptr="*fp32", eps="fp32")
    grp_types = {n: "*bf16" for n in _jit(K._src_group_bwd_kernel).arg_names if n.endswith("_ptr")}
    grp_types.update(ss_ptr="*fp32", lse_ptr="*fp32", delta_ptr="*fp32", part_ptr="*fp32", cpart_ptr="*fp32",
                     s_ptr="*fp32", eps="fp32")
    p6_types = {n: "*bf16" for n in _jit(K._prefix6_kernel).arg_names if n.endswith("_ptr")}
    p6_types.update(w_ptr="*fp32", lse_ptr="*fp32", ss_ptr="*fp32", eps="fp32")
    f7_types = {n: "*bf16" for n in _jit(K._fwd7_kernel).arg_names if n.endswith("_ptr")}
    f7_types.update(s_ptr="*fp32", lse_ptr="*fp32", init_lse_ptr="*fp32", w_ptr="*fp32", rstd_ptr="*fp32",
                    pn_eps="fp32")
    p7_types = {n: "*bf16" for n in _jit(K._prefix7_kernel).arg_names if n.endswith("_ptr")}
    p7_types.update(s_ptr="*fp32", lse_ptr="*fp32")
    dims = dict(D=D, H=H, DH=D // H)
    rows = []
    for name, kernel, types, flags, div, prune in (
            ("fwd7", K._fwd7_kernel, f7_types, dict(HAS_INIT=False, JC=16, PRENORM=False, **dims),
             ("BT", "buf_stride", "s_stride"), K._prune6),
            ("fwd7_prenorm", K._fwd7_kernel, f7_types, dict(HAS_INIT=False, JC=16, PRENORM=True, **dims),
             ("BT", "buf_stride", "s_stride"), K._prune6),
            *((f"prefix7_{kp}", K._prefix7_kernel, p7_types, dict(KP=kp, JC=8, **dims), ("BT", "buf_stride", "s_stride"),
               K._prune_prefix7) for kp in (4, 8)),
            ("src_bwd_table", K._src_bwd_kernel, bwd_types,
             dict(IS_NULL=False, HAS_INIT=False, HAS_S=True, HAS_CINIT=False, **dims),
             ("BT", "BTD", "BTH"), K._prune6),
            (f"prefix{prefix}_fwd", K._prefix6_kernel, p6_types,
             dict(HAS_NULL=False, KP=prefix, DP=triton.next_power_of_2(D)), ("BT", "D", "DH", "buf_stride"),
             K._prune_prefix6),
            ("fwd6", K._fwd6_kernel, fwd_types, dict(HAS_NULL=False, HAS_EXTRA=False, STORE_SCORES=False,
                                                     HAS_INIT=False, D=D, H=H, DH=D // H), ("BT", "buf_stride"),
             K._prune6),
            ("src_bwd", K._src_bwd_kernel, bwd_types,
             dict(IS_NULL=False, HAS_INIT=False, HAS_S=False, HAS_CINIT=False, **dims),
             ("BT", "BTD", "BTH"), K._prune6),
            *((f"group{group}_bwd{'_table' if has_s else ''}", K._src_group_bwd_kernel, grp_types,
               dict(GP=group, KC=16, LOW=True, EMU=False, HAS_S=has_s, **dims),
               ("BT", "BTD", "BTH", "dsr_sh", "dsr_sk", "s_stride"), K._prune_group) for has_s in (False, True)),
            ("prenorm_fwd", K._prenorm_fwd_kernel, pn_types, {}, ("BT", "D", "DH"), K._prune6),
            ("prenorm_stash", K._prenorm_stash_kernel, pn_types, {}, ("BT", "D", "DH"), K._prune6),
            *((f"score_{kp}", K._score_kernel, sc_types, dict(KP=kp, DA=DA, DB=DB, SPLIT=True, DOT=True, EMU=False,
                                                             **dims), ("BT",), None) for kp in (64, 128)),
            ("score_heads", K._score_heads_kernel, sh_types, dict(HP=HP, DA=DA, DB=DB, SPLIT=True, DOT=True,
                                                                   EMU=False, **dims), ("BT",),
             K._prune_score_heads)):
        if kernels is not None and name not in kernels:
            continue
        configs = (K._group_configs(full=True) if kernel is K._src_group_bwd_kernel else
                   K._prefix6_configs(full=True) if kernel is K._prefix6_kernel else
                   K._prefix7_configs(full=True) if kernel is K._prefix7_kernel else
                   [_score_config(K, flags["KP"])] if kernel is K._score_kernel else
                   K._score_heads_configs(full=True) if kernel is K._score_heads_kernel else
                   K._prenorm_configs(full=True) if kernel in (K._prenorm_fwd_kernel, K._prenorm_stash_kernel) else
                   K._v6_configs(full=True))
        tiles = ({"KB": 128} if prune is K._prune_score_heads else
                 {"HP": HP, "DA": DA, "DB": DB} if prune in (K._prune6, K._prune_prefix7)
                 else {"DA": DA, "DB": DB} if prune is K._prune_group else {} if prune is None
                 else {"HP": HP, "DHP": DHP})
        kept = configs if prune is None else prune(configs, {**tiles, **flags})
        for cfg in kept:
            consts = {**flags, **{k: v for k, v in tiles.items() if k != "KB"}, **cfg.kwargs}
            st = compile_stats(kernel, types, consts, cfg.num_warps, div)
            # issue slots per loaded element: SASS instructions of one loop iteration x 32 lanes x warps over the
            # elements one iteration loads (a token block's rows; the prefix kernel: one head's columns)
            # (the source-group kernel: one head's columns of KC reads' douts; the scoring kernel, which has no
            # loop: one head's columns of the source)
            elems = cfg.kwargs["BLOCK_T"] * (D // H if kernel in (K._prefix6_kernel, K._score_kernel) else
                                             flags["KC"] * (D // H) if kernel is K._src_group_bwd_kernel else D)
            rows.append({"size": size, "kernel": name + (f"_kc{cfg.kwargs['KC']}" if "KC" in cfg.kwargs and
                                                         kernel is K._score_heads_kernel else ""),
                         "BLOCK_T": cfg.kwargs["BLOCK_T"],
                         "STAGES": cfg.kwargs.get("STAGES", 1), "warps": cfg.num_warps,
                         **st,
                         "instr_per_element": round(st["loop_instructions"] * 32 * cfg.num_warps / elems, 2)})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=list(WIDTHS), choices=list(WIDTHS))
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--kernels", nargs="+", help="only these (fwd6 src_bwd fwd7 src_bwd_table prefix7_4 prefix7_8 "
                    "prefix8_fwd group8_bwd group8_bwd_table prenorm_fwd prenorm_stash score_64 score_128 "
                    "score_heads); default all")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: kernel_stats compiles the kernels; unset TRITON_INTERPRET", file=sys.stderr)
        raise SystemExit(2)
    import triton
    for size in args.sizes:
        for r in v6_stats(size, kernels=args.kernels):
            if args.json:
                print(json.dumps({**r, "triton": triton.__version__}), flush=True)
            else:
                print(f"{r['size']:5s} {r['kernel']:8s} BLOCK_T {r['BLOCK_T']} stages {r['STAGES']} warps {r['warps']}: "
                      f"{r['registers']} registers, {r['spill_bytes']} B spilled, {r['shared_bytes']} B shared, "
                      f"{r['cp_async']} cp.async, {r['instr_per_element']} instructions per element", flush=True)


if __name__ == "__main__":
    main()
