"""Mechanism probe: does a trained single-head depth query already hide several "heads"?

For every routing site of a trained AttnRes (or MHAR) model and a batch of tokens:

* split the site's query q (D,) into S slices of D/S; each slice scores only its slice of the
  RMS-normed keys and gets its OWN depth softmax a^(s) over the sources;
* the shared softmax a is the single-head one (all slices' scores summed);
* report mean KL(a^(s) || a) over tokens, slices and sites (sites with >= 2 sources);
* null: the same with a random query of matched norm per site (several draws);
* mean pairwise cosine similarity of the sources (all 2L+1 sources at the final read, per token).

A large trained KL vs a small null means the slices of the trained query point to different
depths: a multi-head structure that single-head routing has to average away (paper, "Mechanism
probe": trained 0.273 / 0.570 / 0.701 vs null 0.038 / 0.058 / 0.095 at 100M / 350M / 1B).

The per-site mean routing weights (H, N) are also saved so ``analysis.figures routing_heatmap`` can
draw per-head deviation maps from the probe JSON.

    python -m eval.probe --model RUN_DIR/model.pt --out probe.json [--slices 4] [--text FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from mhar import env
from mhar.model.residuals import display_record, routed_variants
from mhar.atomic import atomic_write_text, check_writable, os_error_line, read_json
from mhar.runs.checkpoint import load_model

from mhar.runs import sidecar
from mhar.runs.sidecar import provenance
from .vocab import check_vocab


# --- pure tensor functions -------------------------------------------------------------------------
def _keys(sources: Tensor, norm_weight: Tensor, eps: float) -> Tensor:
    s = sources.float()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()  # (N, B, T, D)


def slice_softmaxes(sources: Tensor, query: Tensor, norm_weight: Tensor, slices: int,
                    eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Shared and per-slice depth softmaxes.

    Args:
        sources: (N, B, T, D); query, norm_weight: (D,); slices: S dividing D.
    Returns:
        shared (B, T, N) softmax of the full-width score; per_slice (B, T, S, N), slice s scoring
        only its D/S channels.
    """
    N, B, T, D = sources.shape
    if D % slices:
        raise ValueError(f"slices={slices} must divide the model width D={D}")
    k = _keys(sources, norm_weight, eps).view(N, B, T, slices, D // slices)
    part = (k * query.float().view(slices, D // slices)).sum(-1)  # (N, B, T, S) slice scores
    shared = torch.softmax(part.sum(-1), dim=0).permute(1, 2, 0)  # (B, T, N)
    per_slice = torch.softmax(part, dim=0).permute(1, 2, 3, 0)  # (B, T, S, N)
    return shared, per_slice


def slice_kl(sources: Tensor, query: Tensor, norm_weight: Tensor, slices: int, eps: float = 1e-6) -> Tensor:
    """KL(slice softmax || shared softmax) per slice, averaged over tokens: (S,)."""
    shared, per = slice_softmaxes(sources, query, norm_weight, slices, eps)
    logp = torch.log(per.clamp_min(1e-30))
    logq = torch.log(shared.clamp_min(1e-30)).unsqueeze(2)  # (B, T, 1, N)
    kl = (per * (logp - logq)).sum(-1)  # (B, T, S)
    return kl.mean(dim=(0, 1))


def mean_pairwise_cosine(sources: Tensor) -> float:
    """Mean cosine similarity over source pairs i<j, per token, averaged: sources (N, B, T, D)."""
    N = sources.shape[0]
    if N < 2:
        return float("nan")
    u = torch.nn.functional.normalize(sources.float(), dim=-1)  # (N, B, T, D)
    gram = torch.einsum("ibtd,jbtd->btij", u, u)  # (B, T, N, N)
    iu = torch.triu_indices(N, N, offset=1)
    return float(gram[..., iu[0], iu[1]].mean())


def matched_norm_random(query: Tensor, generator: torch.Generator) -> Tensor:
    """A Gaussian random direction with the same L2 norm as ``query``."""
    r = torch.randn(query.shape, generator=generator, dtype=torch.float32)
    return r / r.norm() * query.float().norm()


# --- model side ---------------------------------------------------------------------------------------
def collect_sources(model, input_ids: Tensor) -> list[Tensor]:
    """Re-run the residual loop and return all 2L+1 sources [(B, T, D), ...] in order.

    Site i (sublayer i) reads sources[: i + 1]; the final read reads all of them.
    Needs a model of a routed variant (``mhar.model.residuals.routed_variants()``: attnres, mhar, ...) on the
    eager router (``load_model(..., routing_impl="eager")``).
    """
    res = model.residual
    variant = model.cfg.residual.variant
    if not getattr(res, "routes_full_depth", False):
        raise ValueError(f"the probe needs a model whose residual routes over every sublayer output with one "
                         f"query per site ({', '.join(routed_variants())}), got residual variant {variant!r}")
    cos, sin = model.rotary(input_ids.shape[1], input_ids.device)
    state = res.init(model.embed(input_ids))
    if not isinstance(state, list):
        raise ValueError("collect_sources needs the eager router (load the model with routing_impl='eager')")
    for i in range(model.cfg.n_sublayers):
        h = res.read(state, i)
        state = res.write(state, i, model.sublayer(i, h, cos, sin))
    return list(state)


@dataclass
class ProbeResult:
    model: str
    variant: str
    routing_heads: int
    slices: int
    null_draws: int
    n_tokens: int
    token_source: str
    kl_trained: float
    kl_null: float
    kl_null_sd: float
    mean_pairwise_cosine: float
    per_site: list[dict]
    routing_mean: dict[str, list[list[float]]]

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def probe_model(model, input_ids: Tensor, slices: int = 4, null_draws: int = 8, seed: int = 0,
                model_name: str = "", token_source: str = "") -> ProbeResult:
    """Run the probe on ``input_ids`` (B, T) (see the module docstring)."""
    model.eval()
    srcs = collect_sources(model, input_ids)
    res = model.residual
    n_sites = model.cfg.n_sublayers + 1
    gen = torch.Generator().manual_seed(seed)
    per_site, trained, nulls = [], [], []
    for site in range(n_sites):
        n = min(site + 1, len(srcs))
        if n < 2:
            continue
        stack = torch.stack(srcs[:n], 0)  # (N, B, T, D)
        q, g = res.queries[site], res.key_norms[site]
        kl_t = float(slice_kl(stack, q, g, slices, res.eps).mean())
        kl_n = [float(slice_kl(stack, matched_norm_random(q, gen), g, slices, res.eps).mean())
                for _ in range(null_draws)]
        trained.append(kl_t)
        nulls.append(float(np.mean(kl_n)))
        per_site.append({"site": res.site_name(site, model.cfg.n_sublayers), "n_sources": n, "kl_trained": kl_t,
                         "kl_null": float(np.mean(kl_n)), "query_norm": float(q.float().norm())})
    out = model(input_ids, collect_routing=True)
    routing_mean = {k: v.float().mean(dim=(0, 1)).tolist() for k, v in (out.routing or {}).items()}  # (H, N)
    return ProbeResult(model=model_name, variant=model.cfg.residual.variant, routing_heads=int(res.heads),
                       slices=slices, null_draws=null_draws, n_tokens=int(input_ids.numel()),
                       token_source=token_source, kl_trained=float(np.mean(trained)) if trained else float("nan"),
                       kl_null=float(np.mean(nulls)) if nulls else float("nan"),
                       kl_null_sd=float(np.std(nulls, ddof=1)) if len(nulls) > 1 else float("nan"),
                       mean_pairwise_cosine=mean_pairwise_cosine(torch.stack(srcs, 0)),
                       per_site=per_site, routing_mean=routing_mean)


def probe_tokens(tokenizer, vocab_size: int, batch: int, seq_len: int, text: Optional[str | Path] = None,
                 seed: int = 0, data_dir: Optional[str | Path] = None) -> tuple[Tensor, str]:
    """(input_ids (batch, seq_len), description of where they came from).

    Text from ``text``, else WikiText-2 validation under ``data_dir`` (default ``$MHAR_DATA_DIR``,
    ``mhar.env``); without either, uniform random token ids (recorded as such: the KL is then not the
    paper's quantity)."""
    path = Path(text) if text else None
    root = env.data_dir(data_dir)
    if path is None and root is not None:
        cand = root / "wikitext-2-raw-v1" / "wiki.valid.raw"
        path = cand if cand.is_file() else None
    g = torch.Generator().manual_seed(seed)
    if path is not None:
        if not path.is_file():
            raise FileNotFoundError(f"--text {path}: file not found")
        ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace")[: 4 * batch * seq_len * 8])
        need = batch * seq_len
        if len(ids) < need:
            raise ValueError(f"{path}: only {len(ids)} tokens, need batch*seq_len={need}")
        return torch.tensor(ids[:need], dtype=torch.long).view(batch, seq_len), f"text:{_portable(path, root)}"
    return torch.randint(0, vocab_size, (batch, seq_len), generator=g), f"random(seed={seed})"


def _portable(path: Path, data_root: Optional[Path]) -> str:
    """``path`` as a probe record names it: relative to the data mirror ($MHAR_DATA_DIR/...) or to the working
    folder when under either, so the record does not change when the mirror moves; absolute otherwise."""
    p = path.resolve()
    for root, shown in ((data_root, "$MHAR_DATA_DIR/"), (Path.cwd(), "")):
        if root is not None:
            try:
                return shown + p.relative_to(Path(root).resolve()).as_posix()
            except ValueError:
                pass
    return str(path)


def _run_size(model_path: Path) -> Optional[str]:
    """The size preset the model's run folder records (``summary.json`` beside ``model.pt``), or None."""
    summary = read_json((model_path if model_path.is_dir() else model_path.parent) / "summary.json")
    size = summary.get("size") if isinstance(summary, dict) else None  # none or damaged: the probe does without
    return size if isinstance(size, str) else None


def run_probe(model_path: str | Path, out: str | Path, slices: int = 4, batch: int = 4, seq_len: int = 256,
              text: Optional[str] = None, null_draws: int = 8, seed: int = 0,
              data_dir: Optional[str | Path] = None) -> dict:
    """Load a model, probe it, write the JSON (with provenance) to ``out``; returns the dict."""
    check_writable(Path(out).parent)  # a read-only or full output folder fails now, not after the probe
    torch.manual_seed(seed)
    model, tok, _ = load_model(model_path, routing_impl="eager")  # refuses a model without its checksum
    check_vocab(model, tok, f"--model {model_path}")  # text token ids past the embedding: refused, not an IndexError
    seq_len = min(seq_len, model.cfg.max_seq_len)
    ids, src = probe_tokens(tok, model.cfg.vocab_size, batch, seq_len, text, seed, data_dir)
    d = probe_model(model, ids, slices, null_draws, seed, str(model_path), src).to_dict()
    # how the figure and report name the model: the variant's display record, the size its run records
    d.update(display=display_record(d["variant"]), size=_run_size(Path(model_path)))
    prov = provenance([str(model_path)] + ([text] if text else []),
                      command=["python", "-m", "eval.probe", "--model", str(model_path), "--out", str(out),
                               "--slices", str(slices)])  # the call, not the interpreter's argv (a temp script)
    d["provenance"] = sidecar.tracked(prov)  # time, git state, versions: in the untracked sidecar
    atomic_write_text(Path(out), json.dumps(d, indent=1))  # same-folder temp + fsync + rename
    sidecar.write(out, prov)
    return d


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="exported model (RUN_DIR/model.pt or RUN_DIR)")
    ap.add_argument("--out", required=True, help="output JSON")
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--text", default=None, help="text file to probe on (default: WikiText-2 valid under MHAR_DATA_DIR)")
    ap.add_argument("--data-dir", default=None, help="local data mirror (default: $MHAR_DATA_DIR)")
    ap.add_argument("--null-draws", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    try:
        d = run_probe(a.model, a.out, a.slices, a.batch, a.seq_len, a.text, a.null_draws, a.seed, a.data_dir)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, read-only or forbidden --out
        print("error: " + os_error_line(e, "probe"), file=sys.stderr)
        return 2
    except Exception as e:  # CheckpointError and friends carry their own message
        if type(e).__name__ == "CheckpointError":
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    print(f"KL(slice||shared): trained {d['kl_trained']:.4f}, null {d['kl_null']:.4f}; "
          f"mean source cosine {d['mean_pairwise_cosine']:.3f} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
