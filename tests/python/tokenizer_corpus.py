"""What the tokenizer parity test and benchmark share: text generated from a seed (English, code,
CJK, emoji, numbers, whitespace runs, CRLF, decomposed characters, the characters Unicode 15 and
16 added), a byte-level BPE trained on it by the `tokenizers` package, and that vocabulary behind
the pre-tokenizers of the model families rlserve serves, as tokenizer.json dicts."""
import json
import random

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers, Regex

# The Split patterns of the families' tokenizer.json files (the pre_tokenizer sections).
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
          r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama 3 and GLM-4 / GLM-4.5 (cl100k's pattern with digits in threes).
GLM4 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek-V3 / R1: three Splits in a row (digits in threes, CJK runs, then words), with literal
# CR and LF characters in the third, as the hub's file has them.
DEEPSEEK_V3 = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
# o200k-style cased words (GPT-4o and the tokenizers derived from it).
CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

WORDS = ("the of and to in is that for it as with was on be by this are from at or an have not but "
         "model weights tokens trainer rollout engine gradient policy reward batch sample update "
         "I'm don't we'll they've she'd it's You're IT'S DON'T We'Ll rock'n'roll").split()
SCRIPTS = {
    "latin": "abcdefghijklmnopqrstuvwxyzàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœ",
    "cyrillic": "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
    "greek": "αβγδεζηθικλμνξοπρστυφχψω",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "kana": "あいうえおかきくけこさしすせそたちつてとアイウエオカキクケコサシスセソ",
    "hangul": "가나다라마바사아자차카타파하한국어문장",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "devanagari": "कखगघङचछजझञटठडढणतथदधनपफबभम\u093e\u093f\u0940\u094d",
    "thai": "กขคงจฉชซญดตถทธนบปผพภมยรลวศษสหอ",
}
# Letters, digits and marks of Unicode 15 and 16 (CJK extensions H and I, Kawi, Garay, new
# Latin and Cyrillic letters, Tulu-Tigalari, Sunuwar): what older PCRE2 builds split apart.
NEW_CHARS = ([chr(c) for c in range(0x31350, 0x31360)] + [chr(c) for c in range(0x2EBF0, 0x2EC00)] +
             [chr(c) for c in range(0x11F04, 0x11F10)] + [chr(c) for c in range(0x10D50, 0x10D60)] +
             [chr(c) for c in range(0x10D40, 0x10D4A)] + ["\u1c89", "\u1c8a", "\ua7cb", "\ua7cc", "\ua7dc"] +
             [chr(c) for c in range(0x11380, 0x11390)] + [chr(c) for c in range(0x11BC0, 0x11BD0)] +
             ["\u0897", "\u1b4e", "\u2427", "\u31e4"])
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\u00a0", "\u3000", "\u2028",
          "\u0085", "\u180e", "  \u180e", "\u200b", "\u2003", "\x0b", "\x0c"]
PUNCT = list(".,;:!?'\"()[]{}<>-_/\\@#$%^&*+=|~`") + ["...", "—", "–", "«", "»", "“", "”", "‘", "’", "…", "、", "。", "！"]
EMOJI = ["😀", "🎉", "❤️", "👩‍💻", "👨‍👩‍👧‍👦", "🇩🇪", "👍🏽", "1️⃣", "🏳️‍🌈", "🚀", "✅"]
DECOMPOSED = ["e\u0301", "a\u0308", "o\u0302\u0323", "n\u0303", "\u1100\u1161\u11a8", "\u212b", "\u2126",
              "A\u030a", "q\u0307\u0323", "\u0915\u093c", "c\u0327"]
CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        '{"id": 7, "ok": true}', "x = [1, 2, 3]  # comment", "std::vector<int> v;", "if a != b && c >= d:",
        "SELECT * FROM t WHERE a = 'b';", "<div class=\"x\">&amp;</div>", "$ ls -la | grep foo > out.txt"]


def random_word(rng):
    kind = rng.random()
    if kind < 0.35:
        return rng.choice(WORDS)
    if kind < 0.75:
        alphabet = rng.choice(list(SCRIPTS.values()))
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
    if kind < 0.85:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if kind < 0.9:
        return rng.choice(EMOJI)
    if kind < 0.95:
        return rng.choice(DECOMPOSED) + rng.choice(SCRIPTS["latin"])
    return "".join(rng.choice(NEW_CHARS) for _ in range(rng.randint(1, 4)))


def random_text(rng, n_parts):
    out = []
    for _ in range(n_parts):
        r = rng.random()
        if r < 0.6:
            out.append(random_word(rng))
        elif r < 0.8:
            out.append(rng.choice(SPACES))
        elif r < 0.93:
            out.append(rng.choice(PUNCT))
        elif r < 0.97:
            out.append(rng.choice(CODE))
        else:
            out.append(chr(rng.choice([rng.randint(0x20, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])))
        if rng.random() < 0.5:
            out.append(" ")
    return "".join(out)


def corpus(seed, count, max_parts=60):
    rng = random.Random(seed)
    return [random_text(rng, rng.randint(1, max_parts)) for _ in range(count)]


def train_bpe(vocab_size=32000, seed=7, lines=60000):
    """A byte-level BPE of `vocab_size` ids trained by `tokenizers` on generated text (Qwen2's
    pre-tokenizer, NFC), with the chat specials as added tokens; returns tokenizer.json as a dict."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                               use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed, lines, 80), trainer=trainer)
    return json.loads(tok.to_str())


def byte_level(use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": use_regex}


def split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def family(base, name):
    """`base` (a trained tokenizer.json dict) behind the pre-tokenizer of family `name`."""
    t = json.loads(json.dumps(base))
    t["normalizer"] = None
    if name == "qwen3":  # Qwen2 / Qwen2.5 / Qwen3: NFC, one Split, ByteLevel without its regex
        t["normalizer"] = {"type": "NFC"}
        steps = [split(QWEN2), byte_level()]
    elif name == "qwen35":
        t["normalizer"] = {"type": "NFC"}
        steps = [split(QWEN35), byte_level()]
    elif name == "glm4":
        steps = [split(GLM4), byte_level()]
    elif name == "deepseek_v3":
        t["normalizer"] = {"type": "Sequence", "normalizers": []}
        steps = [split(p) for p in DEEPSEEK_V3] + [byte_level()]
    elif name == "cased":
        steps = [split(CASED), byte_level()]
    elif name == "gpt2":  # ByteLevel with GPT-2's own regex
        steps = [byte_level(use_regex=True)]
    else:
        raise ValueError(name)
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": steps}
    return t


FAMILIES = ["qwen3", "qwen35", "glm4", "deepseek_v3", "cased", "gpt2"]
