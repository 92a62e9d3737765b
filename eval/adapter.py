"""lm-eval adapter for our exported checkpoints (registered as model ``"mhar"``).

    lm_eval --model mhar --model_args pretrained=RUN_DIR/model.pt,max_length=2048 --tasks ...

or, in Python, ``MharLM(pretrained=path)`` / ``MharLM.from_model(model, tokenizer)``.

Scoring follows lm-eval's HF model so numbers are comparable:
  * ``loglikelihood``: context/continuation split by lm-eval's ``TemplateLM`` (trailing
    spaces of the context move to the continuation; the pair is encoded jointly and
    split at the context's token count); ``(context+continuation)[:-1]`` is fed,
    left-truncated to ``max_length``; the continuation's log-probs are summed. A
    continuation longer than ``max_length`` (lm-eval's HF model refuses those) is
    scored in consecutive windows (``score_windows``).
  * ``loglikelihood_rolling``: lm-eval's rolling windows of ``max_length`` tokens
    (default: the model's training context ``cfg.max_seq_len``), first window
    prefixed with the end-of-text token; each token is predicted exactly once.
  * ``generate_until``: greedy decoding, stops at the end-of-text token, at any
    ``until`` string (the output is cut before it) or after ``max_gen_toks`` tokens.
    Inputs longer than ``max_length`` keep their last ``max_length`` tokens.

Requests are sorted by length (longest first) and batched; sequences are
right-padded, which is exact for a causal model (padding only follows the
positions that are read). Only the positions that are scored go through the
output head, in chunks, so long windows with a large vocabulary stay in memory.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# Scored positions per output-head call: bounds the (positions, vocab) fp32 block.
_HEAD_CHUNK = 4096


def _as_int(name: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"MharLM: {name} must be an integer, got {value!r}") from None


@register_model("mhar")
class MharLM(TemplateLM):
    """TemplateLM over a ``mhar.model.Transformer`` and a ``mhar.tokenizer.Tokenizer``."""

    def __init__(
        self,
        pretrained: Optional[str] = None,
        *,
        model: Optional[torch.nn.Module] = None,
        tokenizer: Any = None,
        device: Optional[str] = None,
        batch_size: int | str = 8,
        max_batch_size: Optional[int] = None,  # accepted for lm-eval's CLI; batch size is fixed
        max_length: Optional[int | str] = None,
        max_gen_toks: int | str = 256,
        dtype: Optional[str] = None,
        routing_impl: Optional[str] = None,
        rolling_context: int | str = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if kwargs:
            raise ValueError(f"MharLM: unknown argument(s) {sorted(kwargs)}; see eval/adapter.py for the valid ones")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._device = torch.device(device)
        if (pretrained is None) == (model is None):
            raise ValueError("MharLM: give exactly one of pretrained=<path to model.pt> or model=<Transformer>")
        self.blob: dict = {}
        if pretrained is not None:
            from mhar.checkpoint import load_model

            if routing_impl is None and self._device.type != "cuda":
                routing_impl = "eager"  # Triton kernels need a GPU
            model, tokenizer, self.blob = load_model(pretrained, device=self._device, routing_impl=routing_impl)
        elif tokenizer is None:
            raise ValueError("MharLM: model=... needs tokenizer=... (a mhar.tokenizer.Tokenizer)")
        self.pretrained = pretrained
        self.model = model.to(self._device).eval()
        if dtype is not None:
            if dtype not in _DTYPES:
                raise ValueError(f"MharLM: dtype {dtype!r} not one of {', '.join(_DTYPES)}")
            self.model.to(_DTYPES[dtype])
        self.tokenizer = tokenizer
        # Run the output head only on scored positions when the model exposes its parts.
        self._split_head = hasattr(self.model, "hidden") and hasattr(self.model, "lm_head")
        if str(batch_size).startswith("auto"):
            raise ValueError("MharLM: batch_size='auto' is not supported; give an integer")
        self.batch_size = _as_int("batch_size", batch_size)
        self._max_length = _as_int("max_length", max_length) if max_length is not None else int(model.cfg.max_seq_len)
        self.max_gen_toks = _as_int("max_gen_toks", max_gen_toks)
        self.rolling_context = _as_int("rolling_context", rolling_context)
        for name in ("batch_size", "_max_length", "max_gen_toks", "rolling_context"):
            if getattr(self, name) < 1:
                raise ValueError(f"MharLM: {name.lstrip('_')} must be >= 1, got {getattr(self, name)}")
        if self.rolling_context > self._max_length:
            raise ValueError(f"MharLM: rolling_context={self.rolling_context} exceeds max_length={self._max_length}")

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, **kwargs: Any) -> "MharLM":
        """Wrap an in-memory model (tests, CPT code) without a checkpoint file."""
        return cls(model=model, tokenizer=tokenizer, **kwargs)

    # --- properties lm-eval reads -------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eot_id)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name", type(self.tokenizer).__name__))

    def describe(self) -> dict:
        """Settings that change the numbers (recorded next to every result)."""
        return {"adapter": "mhar", "max_length": self.max_length, "batch_size": self.batch_size,
                "max_gen_toks": self.max_gen_toks, "rolling_context": self.rolling_context,
                "dtype": str(next(self.model.parameters()).dtype), "device": str(self.device),
                "tokenizer": self.tokenizer_name, "eot_id": self.eot_token_id,
                "routing_impl": getattr(getattr(self.model.cfg, "residual", None), "routing_impl", None)}

    # --- tokenization ----------------------------------------------------------------
    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
        return list(self.tokenizer.encode(string))

    def tok_decode(self, tokens: Iterable[int], **kwargs: Any) -> str:
        return self.tokenizer.decode(list(tokens))

    # --- model calls -------------------------------------------------------------------
    def _pad(self, seqs: Sequence[Sequence[int]]) -> torch.Tensor:
        """Right-pad with the end-of-text id -> (B, T) on the device."""
        T = max(len(s) for s in seqs)
        out = torch.full((len(seqs), T), self.eot_token_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        return out.to(self.device)

    def _hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """States before the output head (B, T, D); logits (B, T, V) for models without ``hidden``."""
        if self._split_head:
            return self.model.hidden(input_ids)
        return self.model(input_ids).logits

    def _log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """(N, D) selected states -> (N, V) fp32 log-probabilities."""
        logits = self.model.lm_head(h) if self._split_head else h
        return F.log_softmax(logits.float(), dim=-1)

    @torch.no_grad()
    def _score(self, inputs: list[list[int]], conts: list[list[int]]) -> list[tuple[float, bool]]:
        """For each row: sum log p(cont | preceding tokens) and whether cont is the greedy path.

        ``inputs[i]`` is the fed sequence whose last ``len(conts[i])`` next-token
        predictions are the continuation tokens.
        """
        h = self._hidden(self._pad(inputs))  # (B, T, D|V)
        sel = [h[i, len(inp) - len(cont): len(inp)] for i, (inp, cont) in enumerate(zip(inputs, conts))]
        sel_h = torch.cat(sel)  # (N, D): every scored position of the batch
        tgt = torch.as_tensor([t for cont in conts for t in cont], dtype=torch.long, device=self.device)  # (N,)
        lp_tok, greedy = [], []
        for s in range(0, sel_h.shape[0], _HEAD_CHUNK):
            lp = self._log_probs(sel_h[s: s + _HEAD_CHUNK])  # (n, V)
            t = tgt[s: s + _HEAD_CHUNK]
            lp_tok.append(lp.gather(-1, t[:, None]).squeeze(-1))
            greedy.append(lp.argmax(-1) == t)
        sizes = [len(cont) for cont in conts]
        lp_rows = torch.cat(lp_tok).double().cpu().split(sizes)
        greedy_rows = torch.cat(greedy).cpu().split(sizes)
        return [(float(lp.sum()), bool(g.all())) for lp, g in zip(lp_rows, greedy_rows)]

    def score_windows(self, ctx: list[int], cont: list[int]) -> list[tuple[list[int], list[int]]]:
        """(input, predicted tokens) pairs that predict each continuation token once.

        One window when ``len(ctx + cont) <= max_length + 1`` (the usual case: the input is
        ``(ctx + cont)[:-1]``, left-truncated to ``max_length``); a longer continuation is
        scored in consecutive windows, each token conditioned on up to ``max_length``
        preceding tokens (with an empty context these are exactly the rolling windows).
        """
        whole, L = ctx + cont, self.max_length
        out, s = [], len(ctx)
        while s < len(whole):
            e = min(s + L, len(whole))
            out.append((whole[max(0, e - 1 - L): e - 1], whole[s:e]))
            s = e
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """requests: [((context, continuation) | None, context_ids, continuation_ids)]."""
        pieces, owner = [], []
        for k, (_, ctx, cont) in enumerate(requests):
            if not ctx or not cont:
                raise ValueError("MharLM: a request needs a non-empty context and continuation")
            for piece in self.score_windows(ctx, cont):
                pieces.append(piece)
                owner.append(k)
        coll = Collator(pieces, sort_fn=lambda p: (-len(p[0]), tuple(p[0])))
        scores = []
        pbar = tqdm(total=len(pieces), disable=disable_tqdm or len(pieces) < 2, desc="loglikelihood")
        for chunk in coll.get_batched(n=self.batch_size):
            scores += self._score([inp for inp, _ in chunk], [cont for _, cont in chunk])
            pbar.update(len(chunk))
        pbar.close()
        totals = [[0.0, True] for _ in requests]
        for k, (ll, greedy) in zip(owner, coll.get_original(scores)):
            totals[k][0] += ll
            totals[k][1] = totals[k][1] and greedy
        results = [(ll, greedy) for ll, greedy in totals]
        for (key, _, _), res in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, res)
        return results

    def rolling_windows(self, tokens: list[int]) -> list[tuple[list[int], list[int]]]:
        """Disjoint (context, continuation) windows covering ``tokens`` once (lm-eval's scheme)."""
        return [make_disjoint_window(w) for w in get_rolling_token_windows(
            token_list=tokens, prefix_token=self.prefix_token_id,
            max_seq_len=self.max_length, context_len=self.rolling_context)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            for ctx, cont in self.rolling_windows(self.tok_encode(string)):
                windows.append((None, ctx, cont))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm) if windows else []
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, scores):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    # --- generation --------------------------------------------------------------------
    @torch.no_grad()
    def greedy_generate(self, contexts: list[list[int]], until: Sequence[str], max_new: int) -> list[str]:
        """Greedy continuation of each context; text cut at the first ``until`` string."""
        gen: list[list[int]] = [[] for _ in contexts]
        active = list(range(len(contexts)))
        for _ in range(max_new):
            if not active:
                break
            windows = [(contexts[i] + gen[i])[-self.max_length:] for i in active]
            h = self._hidden(self._pad(windows))  # (B, T, D|V)
            last = torch.stack([h[j, len(w) - 1] for j, w in enumerate(windows)])  # (B, D|V)
            nxt = self._log_probs(last).argmax(-1).tolist()
            still = []
            for i, tok in zip(active, nxt):
                if tok == self.eot_token_id:
                    continue
                gen[i].append(tok)
                if not any(s in self.tok_decode(gen[i]) for s in until):
                    still.append(i)
            active = still
        out = []
        for g in gen:
            text = self.tok_decode(g)
            for s in until:
                text = text.split(s)[0]
            out.append(text)
        return out

    def _gen_settings(self, gen_kwargs: dict) -> tuple[list[str], int]:
        kw = dict(gen_kwargs)
        if kw.pop("do_sample", False) and float(kw.get("temperature", 0.0)) > 0:
            raise ValueError("MharLM: only greedy generation is supported (generation_kwargs do_sample=True)")
        kw.pop("temperature", None)
        until = kw.pop("until", None) or []
        if isinstance(until, str):
            until = [until]
        if not isinstance(until, list):
            raise ValueError(f"MharLM: generation_kwargs 'until' must be a string or list, got {until!r}")
        max_new = _as_int("max_gen_toks", kw.pop("max_gen_toks", self.max_gen_toks))
        if kw:
            raise ValueError(f"MharLM: unsupported generation_kwargs {sorted(kw)} (greedy decoding only)")
        return [s for s in until if s], max_new

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        items = []
        for req in requests:
            context, gen_kwargs = req.args
            ctx = self.tok_encode(context) or [self.prefix_token_id]
            items.append((context, ctx, gen_kwargs))
        coll = Collator(items, sort_fn=lambda x: (-len(x[1]), tuple(x[1])),
                        group_fn=lambda x: x[2], group_by="gen_kwargs")
        results = []
        pbar = tqdm(total=len(items), disable=disable_tqdm or len(items) < 2, desc="generate_until")
        for chunk in coll.get_batched(n=self.batch_size):
            until, max_new = self._gen_settings(chunk[0][2])
            texts = self.greedy_generate([c for _, c, _ in chunk], until, max_new)
            for (context, _, gen_kwargs), text in zip(chunk, texts):
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                results.append(text)
            pbar.update(len(chunk))
        pbar.close()
        return coll.get_original(results)
