"""Exact token counts (DESIGN.md §5): equal to tiktoken's own and to an independent BPE
implementation (puretiktoken), the model -> encoding map, the offline guarantee in a process with
no network and an empty cache, the per-text cache, and ``cut_to_tokens``'s bound."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import puretiktoken
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.errors import TokenizerUnavailable
from worker.tokens import (
    CALIBRATED_CHARS_PER_TOKEN,
    TiktokenTokenizer,
    count_tokens,
    cut_to_tokens,
    encoding_name_for_model,
    estimate_tokens,
    get_encoding,
    seed_tiktoken_cache,
    tokenizer_for,
)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

SAMPLES = {
    "empty": "",
    "ascii": "hello world, the quick brown fox jumps over the lazy dog.",
    "unicode": "naïve café — 日本語のテキスト, Ελληνικά, العربية, e\u0301, 🧪🔬 👩\u200d💻 ﬁ",
    "cjk_mixed": "修复 bug：在 src/app.py 第 42 行，변수 이름을 바꿨습니다 and ran テスト again.",
    "code": textwrap.dedent(
        """\
        def gross_price(product: Product) -> Decimal:
        \t\"\"\"The price including tax.\"\"\"
            if product.price is None:  # unpriced
                raise MissingPrice(f"{product.sku!r}")
            return (product.price.amount * Decimal("1.20")).quantize(Decimal("0.01"))
        """
    ),
    "whitespace_runs": "a"
    + " " * 37
    + "b\n\n\n\n\t\t\t c  \r\n\r\n"
    + " " * 200
    + "\u00a0\u3000end",
    "special_token_text": "before <|endoftext|> mid <|fim_prefix|><|fim_middle|><|fim_suffix|> "
    "<|endofprompt|> after <|im_start|>user",
    "numbers": "1234567890 3.14159 -0.000001 1e-9 0xDEADBEEF 2026-11-30T12:00:00Z 1,000,000",
    "repeats": "=" * 513 + "ab" * 300 + "\n" * 50,
    "json": json.dumps({"path": "src/x.py", "lines": [1, 2, 3], "ok": True, "ü": None}),
    "log": "E   AttributeError: 'NoneType' object has no attribute 'amount'\n"
    "FAILED tests/test_pricing.py::test_x - AttributeError\n2 failed, 6 passed in 0.41s",
}
ENCODINGS = ["o200k_base", "cl100k_base"]
MODEL_OF = {"o200k_base": "gpt-4o", "cl100k_base": "gpt-4"}


@pytest.fixture(scope="module")
def pure() -> dict[str, puretiktoken.Encoding]:
    return {name: puretiktoken.get_encoding(name) for name in ENCODINGS}


@pytest.fixture(scope="module")
def reference() -> dict[str, tiktoken.Encoding]:
    """tiktoken's own encodings, as tiktoken builds them (after our cache seeding)."""
    for name in ENCODINGS:
        get_encoding(name)
    return {name: tiktoken.get_encoding(name) for name in ENCODINGS}


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("sample", SAMPLES)
def test_counts_equal_tiktoken_and_an_independent_bpe(
    encoding: str,
    sample: str,
    pure: dict[str, puretiktoken.Encoding],
    reference: dict[str, tiktoken.Encoding],
) -> None:
    text = SAMPLES[sample]
    ours = get_encoding(encoding).encode(text, disallowed_special=())
    tik = reference[encoding].encode(text, disallowed_special=())
    independent = pure[encoding].encode_ordinary(text)
    assert ours == tik == independent
    assert count_tokens(text, MODEL_OF[encoding]) == len(tik)
    assert TiktokenTokenizer(MODEL_OF[encoding]).count(text) == len(tik)


def test_special_token_text_counts_as_text() -> None:
    text = "<|endoftext|>"
    # As ordinary text it is several tokens, never the single special token.
    assert count_tokens(text) > 1
    assert count_tokens(text, "gpt-4") > 1


@pytest.mark.corpus
def test_counts_on_real_conversation_text(
    corpus_dir: Path, pure: dict[str, puretiktoken.Encoding]
) -> None:
    path = sorted(corpus_dir.glob("*.json.gz"))[0]
    messages = json.loads(gzip.decompress(path.read_bytes()))["messages"]
    text = "\n".join(m.get("content") or "" for m in messages)[:30_000]
    for name in ENCODINGS:
        assert count_tokens(text, MODEL_OF[name]) == len(pure[name].encode_ordinary(text))


# --- model -> encoding --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-4.1-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("claude-sonnet-4", "o200k_base"),
        ("gemini-3-pro-preview", "o200k_base"),
        ("totally-unknown-model", "o200k_base"),
        ("", "o200k_base"),
        (None, "o200k_base"),
    ],
)
def test_encoding_for_model(model: str | None, encoding: str) -> None:
    assert encoding_name_for_model(model) == encoding
    if model and not model.startswith(("gpt", "o")):
        # No tokenizer of theirs: counted with the calibrated estimate (issue 14 §5).
        assert tokenizer_for(model).name == f"chars/{CALIBRATED_CHARS_PER_TOKEN:g}"
    else:
        assert tokenizer_for(model).name == encoding


def test_count_uses_the_models_encoding(reference: dict[str, tiktoken.Encoding]) -> None:
    text = SAMPLES["unicode"] + SAMPLES["code"]
    o200k = len(reference["o200k_base"].encode(text))
    cl100k = len(reference["cl100k_base"].encode(text))
    assert o200k != cl100k  # the sample tells the two encodings apart
    assert count_tokens(text, "gpt-4.1") == o200k
    assert count_tokens(text, "gpt-3.5-turbo") == cl100k
    assert count_tokens(text) == o200k


def test_estimate_is_ceil_chars_over_four() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert tokenizer_for("gpt-4", estimate=True).count("x" * 9) == 3


# --- offline ------------------------------------------------------------------------------------

_NO_NETWORK = textwrap.dedent(
    """
    import socket
    def refuse(*args, **kwargs):
        raise OSError("network disabled by the test")
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse
    """
)
_OFFLINE_CHILD = textwrap.dedent(
    """
    import json, os, socket, sys
    try:
        socket.create_connection(("openaipublic.blob.core.windows.net", 443), timeout=3).close()
        blocked = False
    except OSError:
        blocked = True
    from worker.tokens import count_tokens, get_encoding
    texts = json.loads(sys.stdin.read())
    out = {
        "blocked": blocked,
        "o200k_base": [len(get_encoding("o200k_base").encode(t, disallowed_special=()))
                       for t in texts],
        "cl100k_base": [count_tokens(t, "gpt-3.5-turbo") for t in texts],
        "default": [count_tokens(t) for t in texts],
    }
    print(json.dumps(out))
    """
)


def _isolation() -> str:
    """``unshare -rn`` (a private network namespace with no interfaces) where this process may
    create one; else a child whose socket connects and name lookups raise."""
    unshare = shutil.which("unshare")
    if unshare:
        probe = subprocess.run(
            [unshare, "-rn", "true"], capture_output=True, timeout=10, check=False
        )
        if probe.returncode == 0:
            return "unshare-rn"
    return "patched-connect"


# Set COMPACTOR_TEST_NET_ISOLATION=patched-connect to exercise the fallback where unshare works.
ISOLATION = os.environ.get("COMPACTOR_TEST_NET_ISOLATION") or _isolation()


def run_offline(code: str, *, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with no network (by ISOLATION) and the given env."""
    environ = {
        k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")
    }
    environ["PYTHONPATH"] = str(REPO_ROOT)
    environ.update(env)
    if ISOLATION == "unshare-rn":
        argv = ["unshare", "-rn", sys.executable, "-c", code]
    else:
        argv = [sys.executable, "-c", _NO_NETWORK + code]
    return subprocess.run(
        argv, input=stdin, env=environ, capture_output=True, text=True, timeout=60, check=False
    )


def _cache_names() -> list[str]:
    """tiktoken's own cache file names: the sha1 of each download URL."""
    base = "https://openaipublic.blob.core.windows.net/encodings/"
    return sorted(hashlib.sha1(f"{base}{name}.tiktoken".encode()).hexdigest() for name in ENCODINGS)


@pytest.mark.slow
@pytest.mark.parametrize("isolation", [ISOLATION])
def test_exact_counts_offline_with_an_empty_cache(
    isolation: str, tmp_path: Path, reference: dict[str, tiktoken.Encoding], subprocesses: None
) -> None:
    cache = tmp_path / "fresh-tiktoken-cache"
    cache.mkdir()
    texts = list(SAMPLES.values())
    proc = run_offline(_OFFLINE_CHILD, stdin=json.dumps(texts), TIKTOKEN_CACHE_DIR=str(cache))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["blocked"] is True, "the child could reach the network: the test proves nothing"
    o200k = [len(reference["o200k_base"].encode(t, disallowed_special=())) for t in texts]
    cl100k = [len(reference["cl100k_base"].encode(t, disallowed_special=())) for t in texts]
    assert out["o200k_base"] == o200k
    assert out["default"] == o200k
    assert out["cl100k_base"] == cl100k
    assert sorted(p.name for p in cache.iterdir()) == _cache_names()


@pytest.mark.slow
@pytest.mark.parametrize("isolation", [ISOLATION])
def test_offline_with_default_cache_location(
    isolation: str, tmp_path: Path, subprocesses: None
) -> None:
    """No TIKTOKEN_CACHE_DIR at all: tiktoken's default (``$TMPDIR/data-gym-cache``), empty."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    code = (
        "from worker.tokens import count_tokens\n"
        "print(count_tokens('hello world'), count_tokens('hello world', 'gpt-4'))\n"
    )
    proc = run_offline(code, TMPDIR=str(tmpdir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2"]
    assert sorted(p.name for p in (tmpdir / "data-gym-cache").iterdir()) == _cache_names()


@pytest.mark.slow
def test_empty_cache_dir_variable_is_a_clear_error(subprocesses: None) -> None:
    code = (
        "from worker.errors import TokenizerUnavailable\n"
        "from worker.tokens import count_tokens\n"
        "try:\n"
        "    count_tokens('hello')\n"
        "except TokenizerUnavailable as exc:\n"
        "    print('TokenizerUnavailable:', exc)\n"
    )
    proc = run_offline(code, TIKTOKEN_CACHE_DIR="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("TokenizerUnavailable:")
    assert "TIKTOKEN_CACHE_DIR" in proc.stdout


def test_seed_refuses_empty_cache_dir_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    with pytest.raises(TokenizerUnavailable, match="TIKTOKEN_CACHE_DIR"):
        seed_tiktoken_cache("o200k_base")


def test_seed_writes_a_verified_file_idempotently(tmp_path: Path) -> None:
    path = seed_tiktoken_cache("cl100k_base", tmp_path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
    assert seed_tiktoken_cache("cl100k_base", tmp_path) == path
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp files left


def test_seed_replaces_a_corrupt_cached_file(tmp_path: Path) -> None:
    path = seed_tiktoken_cache("o200k_base", tmp_path)
    path.write_bytes(b"garbage")
    assert seed_tiktoken_cache("o200k_base", tmp_path) == path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def test_unavailable_encoding_is_refused() -> None:
    with pytest.raises(TokenizerUnavailable):
        get_encoding("r50k_base")


# --- cache --------------------------------------------------------------------------------------


def _long(i: int) -> str:
    return f"message {i}: " + "the tool printed a long line of output " * (3 + i % 4)


def test_cache_counts_only_new_texts() -> None:
    tok = TiktokenTokenizer("gpt-4.1")
    history = [_long(i) for i in range(6)]
    first = [tok.count(t) for t in history]
    assert tok.misses == 6
    grown = [*history, _long(6), _long(7), _long(8)]
    second = [tok.count(t) for t in grown]
    assert tok.misses == 9  # only the three new texts were encoded
    assert second[:6] == first
    assert second == [count_tokens(t, "gpt-4.1") for t in grown]
    [tok.count(t) for t in grown]
    assert tok.misses == 9


def test_cache_distinguishes_texts_and_evicts_when_full() -> None:
    tok = TiktokenTokenizer(None, cache_size=2, front_chars=0)
    a, b, c = _long(1), _long(2), _long(3) + " different"
    assert [tok.count(a), tok.count(b), tok.count(c)] == [count_tokens(t) for t in (a, b, c)]
    assert tok.misses == 3
    tok.count(c)
    assert tok.misses == 3
    tok.count(a)  # evicted by the bound of two
    assert tok.misses == 4


def test_front_cache_is_bounded_by_characters_and_falls_back_to_digests() -> None:
    a, b = _long(1), _long(2)
    tok = TiktokenTokenizer(None, front_chars=len(a) + len(b) - 1)  # room for one of the two
    assert [tok.count(a), tok.count(b)] == [count_tokens(a), count_tokens(b)]
    assert tok.misses == 2
    # a was pushed out of the front, but its digest entry answers (no new encoding).
    assert tok.count("".join(a)) == count_tokens(a)
    assert tok.misses == 2


def test_front_cache_hits_are_recorded_for_the_memo() -> None:
    from worker.cache import Recorder

    recorder = Recorder()
    tok = TiktokenTokenizer(None, recorder=recorder)
    text = _long(5)
    tok.count(text)
    with recorder.recording() as recorded:
        tok.count(text)  # answered by the front: still noted, under its digest
    assert list(recorded.used[tok.cache.name].values()) == [count_tokens(text)]
    assert recorded.computed[tok.cache.name] == 0


# --- cut_to_tokens ------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", [s for s in SAMPLES if SAMPLES[s]])
@pytest.mark.parametrize("max_tokens", [0, 1, 2, 3, 7, 20, 10_000])
@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
def test_cut_to_tokens_bound(sample: str, max_tokens: int, model: str) -> None:
    text = SAMPLES[sample]
    cut, was_cut = cut_to_tokens(text, max_tokens, model)
    assert count_tokens(cut, model) <= max_tokens
    assert text.startswith(cut)
    assert was_cut is (count_tokens(text, model) > max_tokens)
    if not was_cut:
        assert cut == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120),
    max_tokens=st.integers(min_value=0, max_value=40),
)
def test_cut_to_tokens_never_exceeds_bound(text: str, max_tokens: int) -> None:
    cut, was_cut = cut_to_tokens(text, max_tokens)
    assert count_tokens(cut) <= max_tokens
    assert text.startswith(cut)
    assert was_cut is (count_tokens(text) > max_tokens)
