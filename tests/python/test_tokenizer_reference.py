"""trainscope's tokenizers give the ids of the reference implementations: Python tiktoken for a
tiktoken file with Llama-3's split pattern, Hugging Face tokenizers for tokenizer.json (GPT-2-style
ByteLevel and Llama-3-style Split + ByteLevel with ignore_merges). The vocabulary is a byte-level
BPE trained here with HF tokenizers on the repository's LLM datasets and this file's Unicode
samples; the texts are those datasets plus edge cases of the split pattern.

Runs the helper program data_tokenize from $TRAINSCOPE_BUILD_DIR (default build/);
scripts/build builds it."""

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

import tiktoken  # scripts/setup installs both (tokenizers comes with transformers)
import tokenizers

ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
TOOL = next((p for p in [BUILD_DIR / "tests" / "data_tokenize", *BUILD_DIR.glob("**/data_tokenize")]
             if p.is_file()), None)
assert TOOL is not None, f"data_tokenize not built under {BUILD_DIR}: run scripts/build"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

EDGE = [
    "I'm", "I'M you'RE they'Ve WE'LL", "'ſ 'ſt", "1234567 12 1,000,000.5", "\n\n", "a  \n\n  b   ",
    "trailing   ", "   ", "\t\t x", "a\r\n\r\nb", "Grüße aus Köln", "日本語のテキスト、です。",
    "emoji 🚀🔥 👩‍👩‍👧 ok", "e\u0301 combining", "nbsp\u00a0here \u00a0 x", "mongolian\u180ex",
    "zw\u200bsp", "nel\u0085x", "ls\u2028ps\u2029x", "\u3000ideo", "x\u001cy\u001fz",
    "٣٤٥٦ arabic digits ١٢", "Ⅻ roman ½ ²", "ΑΒΓ αβγ ΣΊΣΥΦΟΣ", "!!!??? ...\n", " --- ", "'", "''s",
    "don't stop", "HELLO'LL", "a'", "ab'c", "\u0130stanbul \u0131", "ǅ title", "x" * 3000,
    " " * 100 + "x", "\n" * 7 + " y", "a.\n\n\n\nb", "tab\there", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
    "def f(x):\n    return x**2  # square\n", "naïve café résumé déjà vu", "Привет, мир! Как дела?",
    "שלום עולם", "مرحبا بالعالم", "สวัสดีชาวโลก", "안녕하세요 세계", "=" * 5000, "ab" * 2000,
]


def _strings(o):
    if isinstance(o, str):
        yield o
    elif isinstance(o, dict):
        for v in o.values():
            yield from _strings(v)
    elif isinstance(o, list):
        for v in o:
            yield from _strings(v)


def _dataset_texts():
    texts = []
    for f in sorted((ROOT / "inputs" / "llm" / "data").glob("*.json*")):
        if f.suffix == ".jsonl":
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    texts += list(_strings(json.loads(line)))
        else:
            texts += list(_strings(json.loads(f.read_text(encoding="utf-8"))))
    return texts


def _gpt2_byte_table():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokref")
    texts = _dataset_texts() + EDGE
    assert len(texts) > 100
    # A byte-level BPE trained on these texts: ids 0..255 are the byte alphabet, merges follow in
    # order, so id order is merge order and the vocabulary is also a valid tiktoken file.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # (Long runs are left out of training: the trainer is slow on them and learns nothing useful.)
    tok.train_from_iterator([t for t in texts if len(t) < 1000] * 3, trainers.BpeTrainer(
        vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    gpt2_json = d / "gpt2.json"
    tok.save(str(gpt2_json))

    b2u = _gpt2_byte_table()
    u2b = {u: b for b, u in b2u.items()}
    vocab = json.loads(gpt2_json.read_text(encoding="utf-8"))["model"]["vocab"]
    ranks = {bytes(u2b[ch] for ch in t): i for t, i in vocab.items()}
    assert sorted(ranks.values()) == list(range(len(ranks)))
    model = d / "tokenizer.model"
    model.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n"
                             for t, r in sorted(ranks.items(), key=lambda kv: kv[1])))

    # Llama-3-style tokenizer.json from the same ranks: Split(pattern) + ByteLevel without regex,
    # ignore_merges, each merge the two parts that BPE limited to lower ranks ends with.
    def parts(token, max_rank):
        p = [bytes([x]) for x in token]
        while True:
            cand = [(ranks[p[i] + p[i + 1]], i) for i in range(len(p) - 1)
                    if ranks.get(p[i] + p[i + 1], max_rank) < max_rank]
            if not cand:
                return p
            _, i = min(cand)
            p[i:i + 2] = [p[i] + p[i + 1]]

    spell = lambda bb: "".join(b2u[x] for x in bb)  # noqa: E731
    merges = []
    for token, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            p = parts(token, r)
            assert len(p) == 2
            merges.append([spell(p[0]), spell(p[1])])
    n = len(ranks)
    llama_json = d / "llama3.json"
    llama_json.write_text(json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, c in [(n, "<|begin_of_text|>"), (n + 9, "<|eot_id|>")]],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {spell(t): r for t, r in ranks.items()}, "merges": merges}},
        ensure_ascii=False), encoding="utf-8")

    texts_json = d / "texts.json"
    texts_json.write_text(json.dumps(texts), encoding="utf-8")
    return {"texts": texts, "texts_json": texts_json, "ranks": ranks, "model": model,
            "gpt2_json": gpt2_json, "llama_json": llama_json}


def _run(tokenizer, texts_json):
    out = subprocess.run([str(TOOL), str(tokenizer), str(texts_json)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _mismatches(texts, got, want):
    return [(t[:60], g[:12], w[:12]) for t, g, w in zip(texts, got, want) if g != w]


def test_tiktoken_file_matches_tiktoken(setup):
    enc = tiktoken.Encoding("ref", pat_str=LLAMA3_PATTERN, mergeable_ranks=setup["ranks"],
                            special_tokens={})
    want = [enc.encode_ordinary(t) for t in setup["texts"]]
    got = _run(setup["model"], setup["texts_json"])
    assert _mismatches(setup["texts"], got["ids"], want) == []
    assert got["decoded"] == setup["texts"]


def test_gpt2_style_json_matches_hf_tokenizers(setup):
    hf = tokenizers.Tokenizer.from_file(str(setup["gpt2_json"]))
    want = [hf.encode(t, add_special_tokens=False).ids for t in setup["texts"]]
    got = _run(setup["gpt2_json"], setup["texts_json"])
    assert _mismatches(setup["texts"], got["ids"], want) == []
    assert got["decoded"] == setup["texts"]


def test_llama3_style_json_matches_hf_tokenizers_and_tiktoken(setup):
    hf = tokenizers.Tokenizer.from_file(str(setup["llama_json"]))
    want = [hf.encode(t, add_special_tokens=False).ids for t in setup["texts"]]
    enc = tiktoken.Encoding("ref", pat_str=LLAMA3_PATTERN, mergeable_ranks=setup["ranks"],
                            special_tokens={})
    assert want == [enc.encode_ordinary(t) for t in setup["texts"]]
    got = _run(setup["llama_json"], setup["texts_json"])
    assert _mismatches(setup["texts"], got["ids"], want) == []
    assert got["decoded"] == setup["texts"]
