"""Parity of `rlserve tokenize` with the Hugging Face `tokenizers` package.

Three kinds of tokenizer.json, each run through both implementations on the same strings:
  tiny   the tokenizer make-model ships (Qwen2/Qwen3 layout: NFC, Split with the Qwen2 regex,
         ByteLevel without regex): the files `rlserve make-model` writes for its presets (checked
         byte-identical to `rlserve tokenize --write-tiny` at the same size), or --write-tiny's
         alone when the binary has no make-model, plus a 300-id one that splits text finely;
  gpt2   hand-written here: no normalizer, ByteLevel(use_regex=true) with the GPT-2 regex,
         merges in the older "a b" form, added tokens with lstrip/rstrip/normalized/single_word;
  llama3 hand-written here: Split with the Llama-3 regex + ByteLevel(add_prefix_space=true,
         use_regex=false), ignore_merges=true, whole-word vocab entries no merge reaches;
  fallback / unk-fused: a vocab missing some byte symbols, with byte_fallback or a fused <unk>.
For every string: the ids must be equal, decode (skipping and keeping special tokens) must be
equal, and the pieces streamed by rlserve's incremental decoder must add up to the full decode.
Random id sequences (which cut multi-byte characters anywhere) check decode on its own.
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rlserve_testlib import check, run, run_json_lines, temp_dir  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

STRINGS = [
    # empty and ASCII
    "", "a", "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "hello   world", "HELLO WORLD", "MiXeD CaSe", "a.b.c", "!!!???...", "(parenthesised) [bracketed] {braced}",
    "tokenization tokenizer tokenized token tokens", "rollout engine weights trainer",
    # contractions, including upper case and stray apostrophes
    "I'm here", "don't", "we'll", "they've", "she'd", "it's", "You're", "IT'S", "DON'T", "We'Ll",
    "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "''", "'", "rock 'n' roll", "it’s (curly)",
    # digits and numbers
    "0", "42", "12345", "3.14159265358979", "1,000,000", "2024-05-17T09:30:00Z", "+1 (555) 010-0199",
    "0x1F2E3D4C", "1e-9", "123456789012345678901234567890", "v0.17.6", "$3.99 €7,25 £1,000",
    "٣٤٥ ١٢", "½ ² ³ Ⅻ",
    # whitespace runs
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n ", "a \n b",
    "trailing spaces   ", "   leading spaces", "a  b   c    d", "tab\tseparated\tvalues",
    "line one\nline two\n", "mixed \t \n\t whitespace", "\u00a0non-breaking\u00a0space", "\u3000ideographic",
    "\u2028line separator\u2029paragraph", "next\u0085line", "mongolian\u180evowel", "zero\u200bwidth",
    "   \n", "\n   ", "x   ", "x \n\n y",
    # Unicode text
    "café naïve résumé", "Straße Größe Übermut", "El niño comió", "ça va? Très bien.",
    "Москва — столица России.", "Ελληνικά κείμενα", "中文文本用于测试分词器。", "日本語のテキスト、東京。",
    "한국어 문장입니다", "مرحبا بالعالم", "עברית", "हिन्दी भाषा", "ภาษาไทย", "Tiếng Việt có dấu",
    # NFC: decomposed input (e + combining acute), stacked marks, Hangul jamo, singletons
    "cafe\u0301", "e\u0301\u0301", "a\u0323\u0302", "a\u0302\u0323", "\u1100\u1161\u11a8", "\u212b \u2126",
    "\u0041\u030a vs \u00c5", "q\u0307\u0323", "\u0915\u093c", "\u0f73", "\U0001d15e",
    # emoji, ZWJ sequences, flags, skin tones, keycaps
    "😀", "😀😀😀", "I ❤️ tokenizers 🎉", "👩‍💻 👨‍👩‍👧‍👦", "🇩🇪🇫🇷🇯🇵", "👍🏽 👋🏿", "1️⃣ #️⃣", "🏳️‍🌈",
    "emoji at end 🚀", "🚀start", "a😀b", "😀 😀  😀",
    # code
    "def f(x):\n    return x * 2\n", "int main() { return 0; }", "for (int i = 0; i < n; ++i) {}",
    '{"id": 7, "text": "hi", "stream": true}', "x = [1, 2, 3]  # comment", "if a != b && c >= d || !e:",
    "    indented\n        more\n\tTabbed", "std::vector<std::string> v;", "$ ls -la | grep foo > out.txt",
    "<html><body>&amp;</body></html>", "SELECT * FROM t WHERE a = 'b';", "a_b__c___d", "@decorator",
    # special tokens inline, partial and adjacent
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>", "<|endoftext|><|endoftext|>", "text<|endoftext|>more", " <|im_end|> ",
    "<|im_start", "<|im_start|", "im_start|>", "<|<|im_end|>|>", "<|IM_START|>", "<|endoftext|>\n\n",
    # the hand-written tokenizers' added tokens (plain text for the tiny one)
    "a <mask> b", "a<mask>b", "x   <mask>   y", "[SEP]   next", "a[SEP]\n\nb", "say hello world now",
    "hello worlds", "xhello world", "[SEP][SEP]", "<mask><mask>", "<MASK>",
    # invisible and odd characters
    "\u200d", "\ufeffBOM", "\u0000nul\u0001", "\x7f\x80\x9f", "\ufffd", "\U0010ffff", "\ue000 private",
    "soft\u00adhyphen", "\u0301 leading combining mark",
]


def long_strings():
    rng = random.Random(1234)
    words = ["the", "model", "tokens", "weights", "émigré", "Москва", "东京", "😀", "42", "3.14",
             "don't", "IT'S", "  ", "\n", "\t", "<|im_end|>", "foo_bar", "x+y", "...", "'s"]
    out = []
    for n in (50, 400, 2000):
        out.append("".join(rng.choice(words) + rng.choice([" ", "", "\n", "  "]) for _ in range(n)))
    out.append(" " * 3000)
    out.append("a" * 5000)
    out.append("\n" * 500 + "x")
    out.append("😀" * 300)
    return out


def sample_code_points():
    """Every 251st code point outside the surrogates, in a few contexts (the full sweep over all
    1.1M code points passes too; it takes minutes, so the test keeps a sample)."""
    out = []
    for c in range(0, 0x110000, 251):
        if 0xD800 <= c < 0xE000:
            continue
        ch = chr(c)
        out += [f"a{ch}b", f" {ch}{ch} x", f"'{ch}", f"{ch}\u0301", f"1{ch}2", f"\n{ch} "]
    return out


# ---- the hand-written tokenizers ------------------------------------------------------------

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's table, written out independently of rlserve's: printable Latin-1 bytes keep their
    code point, the other 68 bytes take U+0100.. in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


BYTE_SYMBOL = bytes_to_unicode()


def symbols(text):
    return "".join(BYTE_SYMBOL[b] for b in text.encode("utf-8"))


def byte_level(add_prefix_space=False, use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": False,
            "use_regex": use_regex}


def added(id_, content, special, lstrip=False, rstrip=False, normalized=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


def gpt2_style(tiny):
    """Reuses the tiny tokenizer's vocab and merges (byte-level symbols are the same whatever the
    pre-tokenizer) under the GPT-2 pre-tokenizer, with merges in the "a b" form."""
    model = dict(tiny["model"])
    model["merges"] = [f"{a} {b}" for a, b in model["merges"]]
    model["vocab"] = {k: v for k, v in model["vocab"].items()}
    n = len(model["vocab"])
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            added(n, "<|endoftext|>", True),
            added(n + 1, "<mask>", True, lstrip=True),
            added(n + 2, "[SEP]", False, rstrip=True),
            added(n + 3, "hello world", False, normalized=True),  # a space: decodes as raw UTF-8
            added(n + 4, "<|im_end|>", True, single_word=True),
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level(use_regex=True),
        "post_processor": byte_level(),
        "decoder": byte_level(),
        "model": model,
    }


def llama3_style(tiny):
    model = dict(tiny["model"])
    model["ignore_merges"] = True
    vocab = dict(model["vocab"])
    for word in map(symbols, [" tokenization", " weights", " Москва", " rollout", "tokens", "    "]):
        if word not in vocab:
            vocab[word] = len(vocab)
    model["vocab"] = vocab
    n = len(vocab)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n + i, s, True) for i, s in enumerate(QWEN_SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level(add_prefix_space=True)]},
        "post_processor": byte_level(),
        "decoder": byte_level(),
        "model": model,
    }


def fallback_style(tiny, byte_fallback, fuse_unk):
    """A vocab that lacks some byte symbols (controls, 'Q', 'ñ''s bytes), so the unknown-symbol path
    runs: <0xXX> byte tokens when byte_fallback is on, then <unk> (fused or not)."""
    missing = {BYTE_SYMBOL[b] for b in [0, 1, 2, 3, ord("Q"), 0xC3, 0xB1]}
    model = dict(tiny["model"])
    vocab = {k: v for k, v in model["vocab"].items() if not (set(k) & missing)}
    merges = [[a, b] for a, b in model["merges"] if not (set(a + b) & missing)]
    ids = iter(range(10**6))
    vocab = {k: next(ids) for k in vocab}  # renumber without gaps
    for extra in ["<unk>"] + [f"<0x{b:02X}>" for b in range(0x80, 0x100) if b % 3]:
        vocab[extra] = next(ids)
    model.update(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=byte_fallback, fuse_unk=fuse_unk)
    n = len(vocab)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n, "<|endoftext|>", True)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            byte_level()]},
        "post_processor": None,
        "decoder": byte_level(),
        "model": model,
    }


# ---- comparison -----------------------------------------------------------------------------

def compare(name, path, strings, workdir):
    ref = Tokenizer.from_file(path)
    inputs = os.path.join(workdir, f"{name}.jsonl")
    with open(inputs, "w", encoding="utf-8") as f:
        for s in strings:
            f.write(json.dumps(s) + "\n")
    got = run_json_lines("tokenize", "--tokenizer", path, "--text-file", inputs, "--json-lines", "--json")
    got_kept = run_json_lines("tokenize", "--tokenizer", path, "--text-file", inputs, "--json-lines",
                              "--json", "--keep-special")
    check(len(got) == len(strings) and len(got_kept) == len(strings),
          f"{name}: {len(got)}/{len(got_kept)} results for {len(strings)} strings")
    refs = ref.encode_batch(strings)
    failures = []
    for s, g, k, r in zip(strings, got, got_kept, refs):
        want = r.ids
        if g["ids"] != want:
            failures.append(f"encode {s!r}: rlserve {g['ids']} tokenizers {want}")
            continue
        for res, skip in ((g, True), (k, False)):
            want_text = ref.decode(want, skip_special_tokens=skip)
            if res["text"] != want_text:
                failures.append(f"decode(skip={skip}) {s!r}: rlserve {res['text']!r} tokenizers {want_text!r}")
            if "".join(res["stream"]) != res["text"]:
                failures.append(f"stream(skip={skip}) {s!r}: {res['stream']!r} != {res['text']!r}")
    check(not failures, f"{name}: {len(failures)} mismatches:\n" + "\n".join(failures[:20]))
    print(f"{name}: {len(strings)} strings: ids, decode and stream match")


def compare_random_decode(name, path, workdir, count=300):
    ref = Tokenizer.from_file(path)
    n = ref.get_vocab_size()
    rng = random.Random(99)
    lists = [[rng.randrange(n + 3) for _ in range(rng.randrange(1, 12))] for _ in range(count)]
    inputs = os.path.join(workdir, f"{name}.ids")
    with open(inputs, "w") as f:
        for ids in lists:
            f.write(",".join(map(str, ids)) + "\n")
    got = run_json_lines("tokenize", "--tokenizer", path, "--decode-file", inputs, "--json")
    check(len(got) == len(lists), f"{name}: {len(got)} decodes for {len(lists)} id lists")
    for ids, g in zip(lists, got):
        # ids past the vocab are dropped by both
        want = ref.decode(ids)
        check(g["text"] == want, f"{name}: decode {ids}: rlserve {g['text']!r} tokenizers {want!r}")
        check("".join(g["stream"]) == want, f"{name}: stream {ids}: {g['stream']!r}")
    print(f"{name}: {count} random id lists decode identically")


def tiny_tokenizers(d):
    """{name: path}: make-model's tokenizer for each preset (or --write-tiny at 512 and 2048 ids
    when there is no make-model), and a 300-id --write-tiny one."""
    paths = {}
    if "make-model" in run("--help").stdout:
        for preset in ("tiny", "small"):
            out = os.path.join(d, f"make-model-{preset}")
            run("make-model", "--out", out, "--preset", preset)
            with open(os.path.join(out, "config.json")) as f:
                vocab = json.load(f)["vocab_size"]
            mine = os.path.join(d, f"write-tiny-{vocab}")
            run("tokenize", "--write-tiny", mine, "--vocab-size", vocab)
            for fname in ("tokenizer.json", "tokenizer_config.json"):
                with open(os.path.join(out, fname), "rb") as a, open(os.path.join(mine, fname), "rb") as b:
                    check(a.read() == b.read(), f"make-model {preset}: {fname} is not --write-tiny's at {vocab} ids")
            paths[f"make-model-{preset}"] = os.path.join(out, "tokenizer.json")
    else:
        for vocab in (512, 2048):
            out = os.path.join(d, f"write-tiny-{vocab}")
            run("tokenize", "--write-tiny", out, "--vocab-size", vocab)
            paths[f"tiny{vocab}"] = os.path.join(out, "tokenizer.json")
    out = os.path.join(d, "write-tiny-300")
    run("tokenize", "--write-tiny", out, "--vocab-size", 300)
    paths["tiny300"] = os.path.join(out, "tokenizer.json")

    for name, path in paths.items():
        ref = Tokenizer.from_file(path)
        n = ref.get_vocab_size()
        check([ref.token_to_id(s) for s in QWEN_SPECIALS] == [n - 3, n - 2, n - 1], f"{name}: special token ids")
    # Same vocab size, byte-identical files.
    a, b = os.path.join(d, "again-a"), os.path.join(d, "again-b")
    for out in (a, b):
        run("tokenize", "--write-tiny", out, "--vocab-size", 777)
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(a, fname), "rb") as fa, open(os.path.join(b, fname), "rb") as fb:
            check(fa.read() == fb.read(), f"{fname} differs between two runs")
    return paths


def main():
    strings = STRINGS + long_strings()
    with temp_dir() as d:
        tiny = tiny_tokenizers(d)
        largest = max(tiny.values(), key=lambda p: Tokenizer.from_file(p).get_vocab_size())
        with open(largest, encoding="utf-8") as f:
            base = json.load(f)
        hand = {}
        for name, build in (("gpt2", gpt2_style), ("llama3", llama3_style),
                            ("fallback", lambda t: fallback_style(t, True, False)),
                            ("unk-fused", lambda t: fallback_style(t, False, True))):
            hand[name] = os.path.join(d, f"{name}.json")
            with open(hand[name], "w", encoding="utf-8") as f:
                json.dump(build(base), f, ensure_ascii=False)

        first = True
        for name, path in tiny.items():
            compare(name, path, strings + (sample_code_points() if first else []), d)
            first = False
        compare("gpt2", hand["gpt2"], strings + sample_code_points(), d)
        compare("llama3", hand["llama3"], strings, d)
        unknown = ["Q", "QQ Q", "\x00\x01\x02 Quick", "año ñandú", "mañana\x03Q", "QUIZ\x00ñ"]
        compare("fallback", hand["fallback"], strings + unknown, d)
        compare("unk-fused", hand["unk-fused"], strings + unknown, d)
        for name, path in list(tiny.items())[:1] + [("gpt2", hand["gpt2"])]:
            compare_random_decode(name, path, d)
    print("OK")


if __name__ == "__main__":
    main()
