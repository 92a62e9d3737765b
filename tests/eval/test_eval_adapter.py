"""The lm-eval adapter (eval/adapter.py) against direct PyTorch computations on tiny models.

References are computed here from ``model(input_ids).logits`` only, never through the
adapter's own helpers (padding, rolling windows, head-on-selected-positions, batching).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from eval.adapter import MharLM  # noqa: E402
from mhar.runs.checkpoint import save_model  # noqa: E402
from mhar.model.config import model_config  # noqa: E402
from mhar.model.transformer import Transformer  # noqa: E402
from mhar.data.tokenizer import get_tokenizer  # noqa: E402

torch.set_num_threads(1)
DATA_DIR = os.environ.get("MHAR_DATA_DIR")
GPT2_DIR = Path(DATA_DIR, "tokenizers", "gpt2") if DATA_DIR else None
needs_gpt2 = pytest.mark.skipif(
    GPT2_DIR is None or not (GPT2_DIR / "tokenizer.json").is_file(),
    reason="GPT-2 tokenizer not available (set MHAR_DATA_DIR to a dir with tokenizers/gpt2/tokenizer.json)",
)
TOL = 1e-4  # fp32; the adapter pads and applies the head to selected rows only


def _req(kind, *args):
    return Instance(request_type=kind, doc={}, arguments=tuple(args), idx=0)


@torch.no_grad()
def direct_ll(model, ctx_ids, cont_ids, max_len=None):
    """log p(cont | ctx) and greedy flag from one unpadded forward pass."""
    whole = list(ctx_ids) + list(cont_ids)
    if max_len is not None:
        whole = whole[-(max_len + 1):]
    logp = torch.log_softmax(model(torch.tensor([whole[:-1]])).logits[0].double(), -1)  # (T, V)
    n = len(cont_ids)
    rows = logp[-n:]
    tgt = torch.tensor(cont_ids)
    return rows[torch.arange(n), tgt].sum().item(), bool((rows.argmax(-1) == tgt).all())


@pytest.fixture(scope="module")
def byte_model():
    torch.manual_seed(0)
    return Transformer(model_config("debug", residual={"variant": "mhar", "heads": 4})).eval(), get_tokenizer("byte")


@pytest.fixture(scope="module")
def gpt2_model():
    tok = get_tokenizer(str(GPT2_DIR))
    torch.manual_seed(1)
    return Transformer(model_config("debug", vocab_size=tok.vocab_size)).eval(), tok


PHRASE = "the cat sat on the mat."


@pytest.fixture(scope="module")
def parrot():
    """A debug model trained until it repeats ``PHRASE`` + end-of-text (greedy is predictable)."""
    torch.manual_seed(0)
    tok = get_tokenizer("byte")
    model = Transformer(model_config("debug", max_seq_len=64))
    unit = tok.encode(PHRASE) + [tok.eot_id]
    seq = unit * 10
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(400):
        starts = torch.randint(0, len(unit), (8,)).tolist()
        x = torch.tensor([seq[s: s + 49] for s in starts])
        loss = model(x[:, :-1], labels=x[:, 1:]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05, "fixture: the parrot model did not memorise its phrase"
    return model.eval(), tok


# --- loglikelihood --------------------------------------------------------------------
def test_loglikelihood_matches_direct_byte(byte_model):
    model, tok = byte_model
    lm = MharLM.from_model(model, tok, batch_size=3, device="cpu")
    pairs = [("The cat", " sat"), ("Hello, world", "!"), ("a", " much longer continuation here"),
             ("Question: 2+2?\nAnswer:", " 4"), ("x", "y")]
    got = lm.loglikelihood([_req("loglikelihood", c, x) for c, x in pairs])
    for (c, x), (ll, greedy) in zip(pairs, got):
        ref_ll, ref_greedy = direct_ll(model, tok.encode(c), tok.encode(x))
        assert ll == pytest.approx(ref_ll, abs=TOL), (c, x)
        assert greedy == ref_greedy


def test_trailing_space_moves_to_continuation(byte_model):
    """lm-eval's rule: 'The cat ' + 'sat' is scored as 'The cat' + ' sat'."""
    model, tok = byte_model
    lm = MharLM.from_model(model, tok, device="cpu")
    (a, _), (b, _) = lm.loglikelihood([_req("loglikelihood", "The cat ", "sat"), _req("loglikelihood", "The cat", " sat")])
    assert a == pytest.approx(b, abs=1e-9)
    assert a == pytest.approx(direct_ll(model, tok.encode("The cat"), tok.encode(" sat"))[0], abs=TOL)


def test_empty_context_conditions_on_end_of_text(byte_model):
    model, tok = byte_model
    lm = MharLM.from_model(model, tok, device="cpu")
    (ll, _), = lm.loglikelihood([_req("loglikelihood", "", "hello")])
    assert ll == pytest.approx(direct_ll(model, [tok.eot_id], tok.encode("hello"))[0], abs=TOL)


def test_long_inputs_are_left_truncated_to_max_length(byte_model):
    model, tok = byte_model
    lm = MharLM.from_model(model, tok, max_length=32, device="cpu")
    ctx, cont = "0123456789" * 10, " tail"
    (ll, _), = lm.loglikelihood([_req("loglikelihood", ctx, cont)])
    ref, _ = direct_ll(model, tok.encode(ctx), tok.encode(cont), max_len=32)
    assert ll == pytest.approx(ref, abs=TOL)
    full, _ = direct_ll(model, tok.encode(ctx), tok.encode(cont))
    assert abs(full - ref) > 1e-3  # the truncation really changed the input


def test_batch_size_and_order_do_not_change_scores(byte_model):
    model, tok = byte_model
    pairs = [("a" * n, " b" * (1 + n % 3)) for n in (1, 9, 3, 17, 5, 2, 30)]
    reqs = [_req("loglikelihood", c, x) for c, x in pairs]
    one = MharLM.from_model(model, tok, batch_size=1, device="cpu").loglikelihood(reqs)
    many = MharLM.from_model(model, tok, batch_size=4, device="cpu").loglikelihood(reqs)
    for (a, ga), (b, gb) in zip(one, many):
        assert a == pytest.approx(b, abs=TOL) and ga == gb


def test_batch_size_auto_gives_the_numbers_of_an_explicit_batch(byte_model):
    """lm-eval users pass --batch_size auto (and auto:N); the adapter picks the largest batch that fits and the
    scores are those of the same explicit batch size (and of batch 1, up to float rounding)."""
    model, tok = byte_model
    pairs = [("a" * n, " b" * (1 + n % 3)) for n in (1, 9, 3, 17, 5, 2, 30, 40, 7)]
    reqs = [_req("loglikelihood", c, x) for c, x in pairs]
    rolling = [_req("loglikelihood_rolling", "hello world " * n) for n in (1, 30, 4)]
    auto = MharLM.from_model(model, tok, batch_size="auto", max_batch_size=4, device="cpu")
    got, got_r = auto.loglikelihood(reqs), auto.loglikelihood_rolling(rolling)
    assert set(auto.batch_sizes.values()) == {4} and auto.describe()["batch_size"] == "auto"
    fixed = MharLM.from_model(model, tok, batch_size=4, device="cpu")
    assert got == fixed.loglikelihood(reqs) and got_r == fixed.loglikelihood_rolling(rolling)
    one = MharLM.from_model(model, tok, batch_size=1, device="cpu").loglikelihood(reqs)
    assert all(a == pytest.approx(b, abs=TOL) and ga == gb for (a, ga), (b, gb) in zip(got, one))
    # auto:N re-detects for each N-th of the sorted requests (shorter ones: a bigger batch on a CPU)
    sched = MharLM.from_model(model, tok, batch_size="auto:3", max_batch_size=2, device="cpu")
    assert all(a == pytest.approx(b, abs=TOL) for (a, _), (b, _) in zip(sched.loglikelihood(reqs), one))
    assert len(sched.batch_sizes) == 3 and sched.describe()["batch_size"] == "auto:3"
    from eval.adapter import CPU_AUTO_TOKENS

    lm = MharLM.from_model(model, tok, batch_size="auto", max_batch_size=1000, device="cpu")
    assert lm.detect_batch_size(100) == CPU_AUTO_TOKENS // 100 and lm.detect_batch_size(10 ** 6) == \
        CPU_AUTO_TOKENS // lm.max_length  # no request is longer than max_length


def test_largest_batch_backs_off_on_out_of_memory():
    """The CUDA search: halve from max_batch_size until a forward fits; other errors are not swallowed."""
    from eval.adapter import largest_batch

    tried = []

    def fits(b):
        tried.append(b)
        if b > 12:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    assert largest_batch(fits, 64) == 8 and tried == [64, 32, 16, 8]

    def broken(b):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        largest_batch(broken, 64)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        largest_batch(lambda b: fits(100), 4)


@needs_gpt2
def test_gpt2_leading_space_split_and_score(gpt2_model):
    """'The cat' + ' sat' with the GPT-2 BPE: ids hand-checked against the published vocab."""
    model, tok = gpt2_model
    lm = MharLM.from_model(model, tok, device="cpu")
    ctx_ids, cont_ids = lm._encode_pair("The cat", " sat")
    assert (ctx_ids, cont_ids) == ([464, 3797], [3332])  # "The", "Ġcat", "Ġsat"
    assert lm._encode_pair("The cat ", "sat") == (ctx_ids, cont_ids)
    (ll, greedy), = lm.loglikelihood([_req("loglikelihood", "The cat", " sat")])
    ref, ref_greedy = direct_ll(model, [464, 3797], [3332])
    assert ll == pytest.approx(ref, abs=TOL) and greedy == ref_greedy
    # a multi-token continuation: joint encoding split at the context's length
    (ll2, _), = lm.loglikelihood([_req("loglikelihood", "The cat", " sat on the mat")])
    assert ll2 == pytest.approx(direct_ll(model, tok.encode("The cat"), tok.encode(" sat on the mat"))[0], abs=TOL)
    assert lm.eot_token_id == 50256


# --- loglikelihood_rolling ---------------------------------------------------------------
@torch.no_grad()
def direct_rolling(model, ids, eot, L, ctx_len=1):
    """Sum of log p over every token: token i is predicted from the L inputs ending just before it,
    windows advancing by L - ctx_len + 1 predictions (lm-eval's scheme, written out directly)."""
    padded = [eot] + list(ids)  # padded[i] is the input that predicts ids[i]
    total, start = 0.0, 0
    stride = L - ctx_len + 1
    while start < len(ids):
        end = min(len(ids), L if start == 0 else start + stride)
        window = padded[max(0, end - L): end]
        logp = torch.log_softmax(model(torch.tensor([window])).logits[0].double(), -1)
        n = end - start
        tgt = torch.tensor(ids[start:end])
        total += logp[-n:][torch.arange(n), tgt].sum().item()
        start = end
    return total


def test_continuation_longer_than_context_is_scored_in_windows(byte_model):
    """With an empty context, a long continuation is scored exactly like the rolling windows."""
    model, tok = byte_model
    text = "A continuation far longer than the model context. " * 3  # 153 tokens, max_length 32
    lm = MharLM.from_model(model, tok, batch_size=4, max_length=32, device="cpu")
    (ll, greedy), = lm.loglikelihood([_req("loglikelihood", "", text)])
    assert ll == pytest.approx(direct_rolling(model, tok.encode(text), tok.eot_id, 32), abs=1e-3)
    assert greedy is False


@pytest.mark.parametrize("ctx_len", [1, 16])
def test_rolling_matches_direct_sliding_windows(byte_model, ctx_len):
    model, tok = byte_model
    texts = ["Robert Boulter is an English film, television and theatre actor. " * 5, "short", "x" * 64]
    lm = MharLM.from_model(model, tok, batch_size=4, max_length=64, rolling_context=ctx_len, device="cpu")
    got = lm.loglikelihood_rolling([_req("loglikelihood_rolling", t) for t in texts])
    for text, ll in zip(texts, got):
        assert ll == pytest.approx(direct_rolling(model, tok.encode(text), tok.eot_id, 64, ctx_len), abs=1e-3)


def test_rolling_default_window_is_training_context(byte_model):
    model, tok = byte_model
    lm = MharLM.from_model(model, tok, device="cpu")
    assert lm.max_length == model.cfg.max_seq_len == 256
    text = "abc " * 150  # 600 tokens: three windows at 256
    (ll,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", text)])
    assert ll == pytest.approx(direct_rolling(model, tok.encode(text), tok.eot_id, 256), abs=1e-3)
    assert len(lm.rolling_windows(tok.encode(text))) == math.ceil(600 / 256)


# --- generate_until ----------------------------------------------------------------------
@torch.no_grad()
def direct_greedy(model, ids, n, L):
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(model(torch.tensor([(ids + out)[-L:]])).logits[0, -1].argmax())
        out.append(nxt)
    return out


class _CountingHidden:
    def __init__(self, model):
        self.model, self.calls, self._orig = model, 0, model.hidden

    def __enter__(self):
        def hidden(x, *args):
            self.calls += 1
            return self._orig(x, *args)
        self.model.hidden = hidden
        return self

    def __exit__(self, *exc):
        del self.model.hidden


def test_greedy_generation_matches_direct_and_stops(parrot):
    model, tok = parrot
    lm = MharLM.from_model(model, tok, batch_size=4, device="cpu")
    ref = direct_greedy(model, tok.encode("the cat"), 40, 64)
    assert tok.eot_id in ref  # the parrot ends its phrase with end-of-text
    ref_text = tok.decode(ref[: ref.index(tok.eot_id)])
    assert ref_text == " sat on the mat."

    def gen(ctx, **kw):
        with _CountingHidden(model) as c:
            (out,) = lm.generate_until([_req("generate_until", ctx, kw)])
        return out, c.calls

    out, calls = gen("the cat", until=[], max_gen_toks=40)  # stops at end-of-text
    assert out == ref_text and calls == ref.index(tok.eot_id) + 1
    out, calls = gen("the cat", until=["on"], max_gen_toks=40)  # stop string: cut before it
    assert out == " sat " and calls == len(" sat on")
    out, calls = gen("the cat", until=["zzz", "mat"], max_gen_toks=40)
    assert out == " sat on the " and calls == len(" sat on the mat")
    out, calls = gen("the cat", until=["Question:"], max_gen_toks=3)  # token budget
    assert out == " sa" and calls == 3


def test_generation_batched_long_contexts_cut_once(parrot):
    """Mixed lengths in one batch; a context longer than max_length - max_gen_toks keeps its last
    max_length - max_gen_toks tokens once (lm-eval's hf), then generation does not slide."""
    model, tok = parrot
    ctxs = ["the cat", "mat.the cat sat", (PHRASE + "\n") * 5 + "the"]
    lm = MharLM.from_model(model, tok, batch_size=3, device="cpu", max_length=64)
    outs = lm.generate_until([_req("generate_until", c, {"until": ["\n"], "max_new_tokens": 12}) for c in ctxs])
    for c, out in zip(ctxs, outs):
        ref = direct_greedy(model, tok.encode(c)[-(64 - 12):], 12, 10 ** 6)
        if tok.eot_id in ref:
            ref = ref[: ref.index(tok.eot_id)]
        assert out == tok.decode(ref).split("\n")[0]


def test_sampling_is_refused(parrot):
    lm = MharLM.from_model(*parrot, device="cpu")
    with pytest.raises(ValueError, match="greedy"):
        lm.generate_until([_req("generate_until", "the", {"until": [], "do_sample": True, "temperature": 1.0})])


# --- registration, checkpoint loading, argument errors -----------------------------------------
def test_registered_and_loads_checkpoint(byte_model, tmp_path):
    from lm_eval.api.registry import get_model

    model, tok = byte_model
    path = save_model(tmp_path / "model.pt", model, "byte")
    cls = get_model("mhar")
    assert cls is MharLM
    lm = cls.create_from_arg_string(f"pretrained={path},max_length=128", {"batch_size": 2, "device": "cpu"})
    assert lm.max_length == 128 and lm.batch_size == 2
    (ll, _), = lm.loglikelihood([_req("loglikelihood", "The cat", " sat")])
    assert ll == pytest.approx(direct_ll(model, tok.encode("The cat"), tok.encode(" sat"))[0], abs=TOL)


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": "auto:x"}, "auto:N"),
    ({"batch_size": "auto:0"}, "N >= 1"),
    ({"batch_size": 0}, "batch_size"),
    ({"max_length": 0}, "max_length"),
    ({"bogus": 1}, "bogus"),
    ({"dtype": "int8"}, "dtype"),
])
def test_bad_arguments_name_the_field(byte_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        MharLM.from_model(*byte_model, device="cpu", **kwargs)


def test_generation_budget_must_leave_room_for_the_context(parrot):
    lm = MharLM.from_model(*parrot, device="cpu", max_length=64)
    with pytest.raises(ValueError, match="max_gen_toks=64 must be below max_length=64"):
        lm.generate_until([_req("generate_until", "the", {"until": [], "max_new_tokens": 64})])
