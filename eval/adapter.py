"""lm-eval adapter for our exported checkpoints (registered as model ``"mhar"``).

    lm_eval --model mhar --model_args pretrained=RUN_DIR/model.pt,max_length=2048 --tasks ...

or, in Python, ``MharLM(pretrained=path)`` / ``MharLM.from_model(model, tokenizer)``.

Everything follows lm-eval's ``hf`` model (``HFLM``) so numbers are comparable:
  * tokens: ``tok_encode`` applies the tokenizer's own template as ``transformers`` does by
    default (a Llama-3 tokenizer prepends its BOS; GPT-2 style and ``byte`` add nothing);
    ``add_bos_token=True|False`` overrides it as in ``hf``; a string that already starts with
    the prefix token's text gets no second one. The prefix token (empty contexts, first
    rolling window) is ``prefix_token_id`` if given, else the tokenizer's BOS, else end-of-text.
  * ``loglikelihood``: context/continuation split by lm-eval's ``TemplateLM`` (trailing
    spaces of the context move to the continuation; the pair is encoded jointly and
    split at the context's token count); ``(context+continuation)[:-1]`` is fed,
    left-truncated to ``max_length``; the continuation's log-probs are summed. A
    continuation longer than ``max_length`` (lm-eval's HF model refuses those) is
    scored in consecutive windows (``score_windows``).
  * ``loglikelihood_rolling``: lm-eval's rolling windows of ``max_length`` tokens
    (default: the model's training context ``cfg.max_seq_len``), first window
    prefixed with the prefix token; each token is predicted exactly once.
  * ``generate_until``: greedy decoding with the model's static KV cache (``mhar.model.inference.generate``
    -> ``mhar.model.inference.Decoder``: on CUDA each step compiled and replayed as a CUDA graph);
    stops at the end-of-text token, at any ``until`` string or the end-of-text text (the
    output is cut before it) or after ``max_gen_toks`` tokens (aliases ``max_new_tokens``,
    ... as lm-eval's ``normalize_gen_kwargs``). A context longer than
    ``max_length - max_gen_toks`` keeps its last tokens (cut once, as ``hf`` does).

Requests are sorted by length (longest first) and batched; sequences are
right-padded, which is exact for a causal model (padding only follows the
positions that are read). Only the positions that are scored go through the
output head, in chunks, so long windows with a large vocabulary stay in memory.
Scoring runs through ``mhar.model.inference.Scorer``: on CUDA the model's hidden states are
``torch.compile``'d (shape buckets: one graph per batch-size bucket, the length dynamic)
and the log-softmax / gather / greedy check is one fused pass over the logits.
On CUDA each (batch, length) bucket's forward is also replayed as a CUDA graph.
Compiled kernels and autotuning results persist in ``compile_cache`` (model arg, default
``results/cache/compile``; ``none``: torch's defaults; see ``mhar.env.use_compile_cache``).
``compile=false`` (model arg) runs all of it eagerly (``regional`` / ``whole``: see
``mhar.model.inference``); ``cuda_graphs=false`` scores and decodes without CUDA graphs.
Refused when the model is built (ValueError ``MharLM: ...``, before any request): a CUDA ``device`` where
no GPU is visible, and a model whose vocabulary is smaller than its tokenizer's.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from mhar.env import use_compile_cache
from mhar.training.distributed import cuda_missing

from .vocab import check_vocab

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def _as_bool(name: str, value: Any) -> Optional[bool]:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"MharLM: {name} must be true or false, got {value!r}")


# batch_size=auto on a CPU: tokens per forward (batch x length). A CPU forward gains little past a few thousand
# tokens, and memory is what a bigger batch costs; lm-eval's hf model has no CPU rule (it probes as on a GPU).
CPU_AUTO_TOKENS = 16384
AUTO_MAX_BATCH = 64  # lm-eval's hf default for max_batch_size


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def largest_batch(fits, start: int) -> int:
    """The largest batch size ``b <= start`` for which ``fits(b)`` runs without a CUDA out-of-memory error,
    halving from ``start`` (lm-eval's hf model does the same search through accelerate; written here because
    the adapter needs no accelerate). Any error other than out-of-memory is raised; at b = 1 too."""
    b = max(1, int(start))
    while True:
        try:
            fits(b)
            return b
        except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
            if not _is_oom(err) or b == 1:
                raise
            b //= 2
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _parse_batch_size(batch_size: Any) -> tuple[Optional[int], int]:
    """(fixed batch size or None for auto, how many times auto re-detects over a run: the N of auto:N)."""
    text = str(batch_size).strip().lower()
    if text.startswith("auto"):
        _, _, n = text.partition(":")
        try:
            times = int(float(n)) if n else 1
        except ValueError:
            raise ValueError(f"MharLM: batch_size must be an integer, 'auto' or 'auto:N', got {batch_size!r}") from None
        if times < 1:
            raise ValueError(f"MharLM: batch_size auto:N needs N >= 1, got {batch_size!r}")
        return None, times
    return _as_int("batch_size", batch_size), 1


def _as_int(name: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"MharLM: {name} must be an integer, got {value!r}") from None


@register_model("mhar")
class MharLM(TemplateLM):
    """TemplateLM over a ``mhar.model.transformer.Transformer`` and a ``mhar.data.tokenizer.Tokenizer``."""

    def __init__(
        self,
        pretrained: Optional[str] = None,
        *,
        model: Optional[torch.nn.Module] = None,
        tokenizer: Any = None,
        device: Optional[str] = None,
        batch_size: int | str = 8,
        max_batch_size: Optional[int | str] = None,  # the cap of batch_size=auto (lm-eval's hf: 64)
        max_length: Optional[int | str] = None,
        max_gen_toks: int | str = 256,
        dtype: Optional[str] = None,
        routing_impl: Optional[str] = None,
        rolling_context: int | str = 1,
        add_bos_token: Optional[bool | str] = None,
        prefix_token_id: Optional[int | str] = None,
        use_cache: bool | str = True,
        compile: bool | str = "auto",
        cuda_graphs: bool | str = "auto",
        compile_cache: Optional[str] = "results/cache/compile",
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if kwargs:
            raise ValueError(f"MharLM: unknown argument(s) {sorted(kwargs)}; see eval/adapter.py for the valid ones")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        # a GPU asked for and not there is refused, not run on the CPU (mhar-lm-eval passes --device cpu when
        # no --device is given and no GPU is visible: lm-eval's own default is cuda:0)
        missing = cuda_missing(device, f"device={device}", "device=cpu (or leave it out)")
        if missing:
            raise ValueError(f"MharLM: {missing}")
        self._device = torch.device(device)
        if self._device.type == "cuda" and str(compile_cache).lower() not in ("none", ""):
            use_compile_cache(compile_cache)  # persistent compile / autotuning caches (unless the user set them)
        if (pretrained is None) == (model is None):
            raise ValueError("MharLM: give exactly one of pretrained=<path to model.pt> or model=<Transformer>")
        self.blob: dict = {}
        if pretrained is not None:
            # lazy: mhar.model pulls in triton; registering the adapter (mhar-lm-eval --model hf) builds no model
            from mhar.runs.checkpoint import load_model

            if routing_impl is None and self._device.type != "cuda":
                routing_impl = "eager"  # Triton kernels need a GPU
            model, tokenizer, self.blob = load_model(pretrained, device=self._device, routing_impl=routing_impl)
        elif tokenizer is None:
            raise ValueError("MharLM: model=... needs tokenizer=... (a mhar.data.tokenizer.Tokenizer)")
        self.pretrained = pretrained
        self.model = model.to(self._device).eval()
        if dtype is not None:
            if dtype not in _DTYPES:
                raise ValueError(f"MharLM: dtype {dtype!r} not one of {', '.join(_DTYPES)}")
            self.model.to(_DTYPES[dtype])
        self.tokenizer = tokenizer

        # token ids past the embedding table would fail in the middle of an evaluation: refused now
        check_vocab(self.model, tokenizer, f"MharLM: pretrained={pretrained}" if pretrained is not None
                    else f"MharLM: model={type(self.model).__name__}")
        # Run the output head only on scored positions when the model exposes its parts.
        self._split_head = hasattr(self.model, "hidden") and hasattr(self.model, "lm_head")
        fixed, self.batch_schedule = _parse_batch_size(batch_size)
        self.auto_batch = fixed is None
        self.max_batch_size = _as_int("max_batch_size", max_batch_size) if max_batch_size is not None \
            else AUTO_MAX_BATCH
        self.batch_size = fixed if fixed is not None else "auto" if self.batch_schedule == 1 \
            else f"auto:{self.batch_schedule}"
        self.batch_sizes: dict[int, int] = {}  # auto: sequence length probed -> batch size found
        self._max_length = _as_int("max_length", max_length) if max_length is not None else int(model.cfg.max_seq_len)
        self.max_gen_toks = _as_int("max_gen_toks", max_gen_toks)
        self.rolling_context = _as_int("rolling_context", rolling_context)
        for name in ("max_batch_size", "_max_length", "max_gen_toks", "rolling_context") + \
                (() if self.auto_batch else ("batch_size",)):
            if getattr(self, name) < 1:
                raise ValueError(f"MharLM: {name.lstrip('_')} must be >= 1, got {getattr(self, name)}")
        self.add_bos_token = _as_bool("add_bos_token", add_bos_token)
        self.use_cache = _as_bool("use_cache", use_cache)
        self.custom_prefix_token_id = None if prefix_token_id is None else _as_int("prefix_token_id", prefix_token_id)
        if self.rolling_context > self._max_length:
            raise ValueError(f"MharLM: rolling_context={self.rolling_context} exceeds max_length={self._max_length}")
        mode = str(compile).strip().lower() if compile is not None else "auto"
        self.compile = mode if mode in ("auto", "regional", "whole", "none") else _as_bool("compile", compile)
        self.cuda_graphs = "auto" if cuda_graphs in (None, "auto") else _as_bool("cuda_graphs", cuda_graphs)
        self.scorer = None
        if self._split_head:
            from mhar.model.inference import decoder_for, scorer_for  # lazy: triton, as load_model above

            self.scorer = scorer_for(self.model, compile=self.compile, cuda_graphs=self.cuda_graphs)
            decoder_for(self.model, compile=self.compile, cuda_graphs=self.cuda_graphs)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, **kwargs: Any) -> "MharLM":
        """Wrap an in-memory model (tests, CPT code) without a checkpoint file."""
        return cls(model=model, tokenizer=tokenizer, **kwargs)

    # --- properties lm-eval reads -------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eot_id)

    @property
    def prefix_token_id(self) -> int:
        """Conditioning token of empty contexts and of the first rolling window (``hf``'s rule)."""
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        bos = getattr(self.tokenizer, "bos_id", None)
        return int(bos) if bos is not None else self.eot_token_id

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
                **({"auto_batch_sizes": dict(self.batch_sizes)} if self.auto_batch else {}),
                "max_gen_toks": self.max_gen_toks, "rolling_context": self.rolling_context,
                "dtype": str(next(self.model.parameters()).dtype), "device": str(self.device),
                "tokenizer": self.tokenizer_name, "eot_id": self.eot_token_id,
                "prefix_token_id": self.prefix_token_id, "add_bos_token": self.add_bos_token,
                "kv_cache": self.use_cache, "compile": self.scorer.mode() if self.scorer else "none",
                "routing_impl": getattr(getattr(self.model.cfg, "residual", None), "routing_impl", None)}

    # --- tokenization ----------------------------------------------------------------
    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None,
                   left_truncate_len: Optional[int] = None, **kwargs: Any) -> list[int]:
        """Token ids as ``hf`` encodes them (see the module docstring)."""
        special = add_special_tokens if add_special_tokens is not None else self.add_bos_token
        if special is None:
            special = True  # the tokenizer's default template, as transformers' encode()
        prefix_text = self.tok_decode([self.prefix_token_id], skip_special_tokens=False)
        if add_special_tokens is None and prefix_text and string.startswith(prefix_text):
            special = False  # the text already carries its BOS
        ids = list(self.tokenizer.encode(string, add_special_tokens=special))
        bos = getattr(self.tokenizer, "bos_id", None)
        if special and self.add_bos_token and bos is not None and ids[:1] != [bos]:
            ids = [int(bos)] + ids  # add_bos_token=True on a tokenizer whose template has no BOS
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens: Iterable[int], skip_special_tokens: bool = True, **kwargs: Any) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

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
            return self.scorer.hidden(input_ids)
        return self.model(input_ids).logits

    def _token_logprobs(self, h: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, D) selected states (or logits) -> fp32 log p(tgt) (N,) and whether tgt is the argmax (N,)."""
        if self._split_head:
            return self.scorer.token_logprobs(h, tgt)
        from mhar.model.inference import chunked_logprobs, logit_logprobs  # lazy: as the scorer's in __init__

        return chunked_logprobs(logit_logprobs, h, tgt)  # the library's chunks and formula, on given logits

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
        lp_tok, greedy = self._token_logprobs(sel_h, tgt)
        sizes = [len(cont) for cont in conts]
        # fp32 sums per row, as hf sums its gathered fp32 log-probs: equal totals to the last bit
        lp_rows = lp_tok.cpu().split(sizes)
        greedy_rows = greedy.cpu().split(sizes)
        return [(float(lp.contiguous().sum()), bool(g.all())) for lp, g in zip(lp_rows, greedy_rows)]

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
        for chunk in coll.get_batched(**self._batching(len(pieces), lambda p: len(p[0]))):
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

    # --- batch size ---------------------------------------------------------------------
    def _batching(self, n_items: int, length) -> dict:
        """``Collator.get_batched`` arguments: a fixed ``n``, or for batch_size=auto(:N) a ``batch_fn`` that picks
        the size of each batch when it starts, from the length of its first (longest) item, re-detected N times
        over the run (at the first batch of each N-th of the sorted items), as lm-eval's hf model does."""
        if not self.auto_batch:
            return {"n": self.batch_size}
        span = max(1, -(-n_items // self.batch_schedule))  # items per re-detection
        state = {"start": 0, "size": 0, "part": -1}

        def batch_fn(i: int, items) -> int:
            if i >= state["start"] + state["size"]:  # a new batch begins at item i
                part = i // span
                if part != state["part"]:
                    state["part"], state["auto"] = part, self.detect_batch_size(length(items[i]))
                state["start"], state["size"] = i, state["auto"]
            return state["size"]

        return {"n": 0, "batch_fn": batch_fn}

    def detect_batch_size(self, length: int) -> int:
        """The largest batch (up to ``max_batch_size``) of ``length``-token sequences to score at once: on CUDA
        found by running the scoring forward and halving on out-of-memory; on a CPU ``CPU_AUTO_TOKENS`` tokens
        per forward."""
        length = max(1, min(int(length), self.max_length))
        if length in self.batch_sizes:
            return self.batch_sizes[length]
        if self.device.type == "cuda":
            def fits(b: int) -> None:  # every position scored: the most memory a request of this length needs
                row = [self.prefix_token_id] * length
                self._score([row] * b, [row] * b)

            size = largest_batch(fits, self.max_batch_size)
        else:
            size = max(1, min(self.max_batch_size, CPU_AUTO_TOKENS // length))
        self.batch_sizes[length] = size
        return size

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
        """Greedy continuation of each context (already cut to fit); text cut at the first ``until`` string."""
        until = [s for s in until if s]

        def hit(_row: int, toks: list[int]) -> bool:
            return bool(until) and any(s in self.tok_decode(toks) for s in until)

        if not self._split_head:
            raise ValueError("MharLM: generate_until needs a mhar.model.transformer.Transformer (a model with "
                             "hidden and lm_head)")
        from mhar.model.inference import generate  # lazy: as the scorer's in __init__

        gen = generate(self.model, contexts, max_new, stop_ids=[self.eot_token_id], should_stop=hit,
                       use_cache=self.use_cache, max_length=self.max_length)
        return [postprocess_generated_text(self.tok_decode(g), list(until), None) for g in gen]

    def _gen_settings(self, gen_kwargs: dict) -> tuple[list[str], int]:
        """lm-eval's normalised generation settings -> (stop strings incl. the end-of-text text, max new tokens)."""
        if not isinstance(gen_kwargs, dict):
            raise ValueError(f"MharLM: generation_kwargs must be a dict, got {gen_kwargs!r}")
        until = gen_kwargs.get("until")
        if until is not None and not isinstance(until, (str, list)):
            raise ValueError(f"MharLM: generation_kwargs 'until' must be a string or list, got {until!r}")
        kw = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        if kw.pop("do_sample", False) and float(kw.get("temperature", 0.0)) > 0:
            raise ValueError("MharLM: only greedy generation is supported (generation_kwargs do_sample=True)")
        kw.pop("temperature", None)
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        until = handle_stop_sequences(kw.pop("until", None), eos=eos or None)
        max_new = _as_int("max_gen_toks", kw.pop("max_gen_toks"))
        if kw:
            raise ValueError(f"MharLM: unsupported generation_kwargs {sorted(kw)} (greedy decoding only)")
        if max_new >= self.max_length:
            raise ValueError(f"MharLM: max_gen_toks={max_new} must be below max_length={self.max_length} "
                             "(the context needs room, as in lm-eval's hf model)")
        return until, max_new

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        items = []
        for req in requests:
            context, gen_kwargs = req.args
            ctx = self.tok_encode(context) or [self.prefix_token_id]
            items.append((context, ctx, gen_kwargs))
        coll = Collator(items, sort_fn=lambda x: (-len(x[1]), x[0]),
                        group_fn=lambda x: x[2], group_by="gen_kwargs")
        results = []
        pbar = tqdm(total=len(items), disable=disable_tqdm or len(items) < 2, desc="generate_until")
        for chunk in coll.get_batched(**self._batching(len(items), lambda _: self.max_length)):
            until, max_new = self._gen_settings(chunk[0][2])
            room = self.max_length - max_new  # cut the context once, as hf's left_truncate_len
            texts = self.greedy_generate([c[-room:] for _, c, _ in chunk], until, max_new)
            for (context, _, gen_kwargs), text in zip(chunk, texts):
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                results.append(text)
            pbar.update(len(chunk))
        pbar.close()
        return coll.get_original(results)
