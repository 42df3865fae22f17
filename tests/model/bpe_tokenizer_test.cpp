// bpe_tokenizer: the GPT-2 byte table, merge order, added tokens, streaming decode, NFC, UTF-8
// repair, and one load error per malformed or unsupported tokenizer.json feature (each must name
// the JSON path). Parity with the `tokenizers` package on real inputs is
// tests/python/test_tokenizer_parity.py; these tests pin the behaviours one at a time.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "model/bpe_tokenizer.hpp"
#include "model/tiny_tokenizer.hpp"

using rlserve::model::bpe_tokenizer;
using rlserve::model::incremental_decoder;
namespace detail = rlserve::model::bpe_detail;
using json = nlohmann::json;

namespace {

using ids_t = std::vector<int32_t>;

// A byte-level tokenizer.json: the 256 byte symbols (id = byte), then one token per merge (in
// merge order), then the added tokens. Tests edit the returned JSON to make it malformed.
json make_json(const std::vector<std::pair<std::string, std::string>>& merges,
               const std::vector<json>& added = {}, json pre_tokenizer = nullptr) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[detail::bytes_to_symbols(std::string(1, char(b)))] = b;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    const std::string sa = detail::bytes_to_symbols(a), sb = detail::bytes_to_symbols(b);
    if (!vocab.contains(sa + sb))
      vocab[sa + sb] = vocab.size();
    m.push_back({sa, sb});
  }
  if (pre_tokenizer.is_null())
    pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

json added_token(int32_t id, std::string content, bool special, bool lstrip = false, bool rstrip = false) {
  return {{"id", id},          {"content", content}, {"special", special}, {"lstrip", lstrip},
          {"rstrip", rstrip},  {"normalized", false}, {"single_word", false}};
}

bpe_tokenizer load(const json& j) {
  auto tok = bpe_tokenizer::from_json(j);
  BOOST_TEST_REQUIRE(tok.has_value(), (tok ? "" : tok.error()));
  return std::move(*tok);
}

std::string load_error(const json& j) {
  auto tok = bpe_tokenizer::from_json(j);
  BOOST_TEST_REQUIRE(!tok.has_value());
  return tok.error();
}

ids_t bytes_of(std::string_view s) {
  ids_t ids;
  for (unsigned char c : s)
    ids.push_back(c);
  return ids;
}

std::string stream_all(const bpe_tokenizer& tok, const ids_t& ids, std::vector<std::string>* pieces = nullptr,
                       bool skip_special = true) {
  incremental_decoder dec(tok, skip_special);
  std::string out;
  for (int32_t id : ids) {
    auto p = dec.push(id);
    if (pieces)
      pieces->push_back(p);
    out += p;
  }
  return out + dec.finish();
}

} // namespace

BOOST_AUTO_TEST_SUITE(bpe_tokenizer_test)

BOOST_AUTO_TEST_CASE(byte_table_is_gpt2s) {
  const auto& table = detail::byte_to_unicode();
  auto t = [&](int b) { return uint32_t(table[b]); }; // char32_t has no operator<<
  // Printable bytes map to themselves; the 68 others take U+0100.. in byte order.
  BOOST_TEST(t('!') == uint32_t(U'!'));
  BOOST_TEST(t('~') == uint32_t(U'~'));
  BOOST_TEST(t(0xA1) == uint32_t(U'\u00A1'));
  BOOST_TEST(t(0xFF) == uint32_t(U'\u00FF'));
  BOOST_TEST(t(0x00) == uint32_t(U'\u0100'));
  BOOST_TEST(t(' ') == uint32_t(U'\u0120')); // 'Ġ'
  BOOST_TEST(t('\n') == uint32_t(U'\u010A')); // 'Ċ'
  BOOST_TEST(t('\t') == uint32_t(U'\u0109')); // 'ĉ'
  BOOST_TEST(t(0x7F) == uint32_t(U'\u0121'));
  BOOST_TEST(t(0xA0) == uint32_t(U'\u0142'));
  BOOST_TEST(t(0xAD) == uint32_t(U'\u0143')); // the last moved byte
  std::set<char32_t> seen(table.begin(), table.end());
  BOOST_TEST(seen.size() == 256u);
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, char(b));
    BOOST_TEST(detail::symbols_to_bytes(detail::bytes_to_symbols(one)).value() == one);
  }
  BOOST_TEST(detail::bytes_to_symbols(" hello\n") == "\u0120hello\u010A");
  BOOST_TEST(!detail::symbols_to_bytes("\u4E2D").has_value()); // not a byte symbol
}

BOOST_AUTO_TEST_CASE(merges_apply_lowest_rank_first) {
  // "ell": with l+l ranked first it becomes e|ll; with e+l first, el|l.
  auto ll_first = load(make_json({{"l", "l"}, {"e", "l"}}));
  auto el_first = load(make_json({{"e", "l"}, {"l", "l"}}));
  BOOST_TEST(ll_first.encode("ell") == (ids_t{'e', 256}), boost::test_tools::per_element());
  BOOST_TEST(el_first.encode("ell") == (ids_t{256, 'l'}), boost::test_tools::per_element());
  // Same rank at two places: the leftmost goes first ("aaa" -> aa|a).
  auto aa = load(make_json({{"a", "a"}}));
  BOOST_TEST(aa.encode("aaa") == (ids_t{256, 'a'}), boost::test_tools::per_element());
  BOOST_TEST(aa.encode("aaaa") == (ids_t{256, 256}), boost::test_tools::per_element());
  // Merges build on merges; pre-tokens (" world" keeps its space) are merged separately.
  auto hw = load(make_json({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}}));
  BOOST_TEST(hw.encode("hello") == (ids_t{259}), boost::test_tools::per_element());
  BOOST_TEST(hw.encode("hello world") == (ids_t{259, 260, 'o', 'r', 'l', 'd'}),
             boost::test_tools::per_element());
  BOOST_TEST(hw.decode(hw.encode("hello world")) == "hello world");
  BOOST_TEST(hw.encode("").empty());
}

BOOST_AUTO_TEST_CASE(legacy_string_merges_equal_pair_merges) {
  json pairs = make_json({{"h", "e"}, {" ", "t"}, {" t", "he"}});
  json legacy = pairs;
  legacy["model"]["merges"] = json::array();
  for (const auto& m : pairs["model"]["merges"])
    legacy["model"]["merges"].push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  auto a = load(pairs), b = load(legacy);
  for (std::string s : {"the theme", " the", "hehe the  the"})
    BOOST_TEST(a.encode(s) == b.encode(s), boost::test_tools::per_element());
  BOOST_TEST(a.encode(" the") == (ids_t{258}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(cache_gives_the_same_ids_and_is_thread_safe) {
  auto tok = load(make_json({{"a", "b"}, {"ab", "c"}, {" ", "abc"}}));
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += i % 3 ? " abc" : " abcabc x";
  const ids_t first = tok.encode(text), second = tok.encode(text);
  BOOST_TEST(first == second, boost::test_tools::per_element());
  std::vector<ids_t> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i)
        results[t] = tok.encode(text);
    });
  for (auto& th : threads)
    th.join();
  for (const auto& r : results)
    BOOST_TEST((r == first));
}

BOOST_AUTO_TEST_CASE(added_tokens_match_whole_and_strip) {
  auto tok = load(make_json({{"h", "i"}},
                            {added_token(257, "<|end|>", true), added_token(258, "<mask>", true, true, false),
                             added_token(259, "[SEP]", false, false, true)}));
  BOOST_TEST(tok.vocab_size() == 260);
  BOOST_TEST(tok.encode("hi<|end|>") == (ids_t{256, 257}), boost::test_tools::per_element());
  BOOST_TEST(tok.encode("<|end|><|end|>") == (ids_t{257, 257}), boost::test_tools::per_element());
  BOOST_TEST(tok.encode("<|end|") == bytes_of("<|end|"), boost::test_tools::per_element());
  // lstrip eats the spaces before <mask>; rstrip the whitespace after [SEP].
  BOOST_TEST(tok.encode("hi   <mask>") == (ids_t{256, 258}), boost::test_tools::per_element());
  BOOST_TEST(tok.encode("[SEP] \n hi") == (ids_t{259, 256}), boost::test_tools::per_element());
  // Special tokens are skipped by default, non-special added tokens never.
  const ids_t ids{256, 257, 259, 256};
  BOOST_TEST(tok.decode(ids) == "hi[SEP]hi");
  BOOST_TEST(tok.decode(ids, false) == "hi<|end|>[SEP]hi");
  BOOST_TEST(tok.is_special(257));
  BOOST_TEST(!tok.is_special(259));
  BOOST_TEST(!tok.is_special(256));
  BOOST_TEST(tok.token_id("<mask>").value() == 258);
  BOOST_TEST(tok.token_id("hi").value() == 256);
  BOOST_TEST(!tok.token_id("nope").has_value());
  BOOST_TEST(tok.token_text(' ').value() == "\u0120");
  BOOST_TEST(tok.token_text(257).value() == "<|end|>");
  BOOST_TEST(!tok.token_text(9999).has_value());
  BOOST_TEST(tok.special_token_ids() == (ids_t{257, 258}), boost::test_tools::per_element());
  // Unknown ids are skipped, as `tokenizers` does.
  BOOST_TEST(tok.decode(ids_t{'o', -1, 100000, 'k'}) == "ok");
}

BOOST_AUTO_TEST_CASE(incremental_decode_holds_back_split_emoji) {
  auto tok = load(make_json({}));
  const std::string emoji = "\U0001F600"; // 4 bytes: F0 9F 98 80, one byte token each
  const ids_t ids = bytes_of("a" + emoji + "b");
  std::vector<std::string> pieces;
  BOOST_TEST(stream_all(tok, ids, &pieces) == "a" + emoji + "b");
  const std::vector<std::string> want{"a", "", "", "", emoji, "b"};
  BOOST_TEST(pieces == want, boost::test_tools::per_element());

  // Cut off: the rest becomes one U+FFFD, as decode does.
  incremental_decoder dec(tok);
  BOOST_TEST(dec.push(0xF0).empty());
  BOOST_TEST(dec.push(0x9F).empty());
  BOOST_TEST(dec.pending_bytes() == 2u);
  BOOST_TEST(dec.finish() == "\uFFFD");
  BOOST_TEST(tok.decode(ids_t{0xF0, 0x9F}) == "\uFFFD");

  // A ZWJ sequence of two-byte merges, special tokens in between, invalid bytes in the middle.
  auto merged = load(make_json({{"\xF0", "\x9F"}, {"\x98", "\x80"}}, {added_token(258, "<s>", true)}));
  const ids_t seq{256, 257, 258, 0xE2, 0x80, 0x8D, 256, 257, 0xC0, 'x', 0xE2, 0x82};
  for (bool skip : {true, false}) {
    const std::string full = merged.decode(seq, skip);
    BOOST_TEST(stream_all(merged, seq, nullptr, skip) == full);
  }
  BOOST_TEST(merged.decode(seq) == emoji + "\u200D" + emoji + "\uFFFDx\uFFFD");
}

BOOST_AUTO_TEST_CASE(utf8_repair_matches_python_replace) {
  BOOST_TEST(detail::utf8_lossy("\xF0\x9F\x98") == "\uFFFD");
  BOOST_TEST(detail::utf8_lossy("\xE0\x80") == "\uFFFD\uFFFD");
  BOOST_TEST(detail::utf8_lossy("\xC0\xAF") == "\uFFFD\uFFFD");
  BOOST_TEST(detail::utf8_lossy("\xED\xA0\x80") == "\uFFFD\uFFFD\uFFFD");
  BOOST_TEST(detail::utf8_lossy("\xF4\x90\x80\x80") == "\uFFFD\uFFFD\uFFFD\uFFFD");
  BOOST_TEST(detail::utf8_lossy("a\xF0\x9F\x98\x80\xF0" "b") == "a\U0001F600\uFFFDb");
  // encode() reads invalid input as U+FFFD rather than failing.
  auto tok = load(make_json({}));
  BOOST_TEST(tok.encode("a\xFF") == bytes_of("a\uFFFD"), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(nfc_composes_like_tokenizers) {
  BOOST_TEST(detail::nfc("plain ASCII stays") == "plain ASCII stays");
  BOOST_TEST(detail::nfc("cafe\u0301") == "caf\u00E9");
  BOOST_TEST(detail::nfc("\u212B") == "\u00C5");                       // singleton
  BOOST_TEST(detail::nfc("\u0958") == "\u0915\u093C");                 // composition exclusion
  BOOST_TEST(detail::nfc("\u1100\u1161\u11A8") == "\uAC01");           // Hangul L V T
  BOOST_TEST(detail::nfc("a\u0323\u0302") == "\u1EAD");                // two marks, either order
  BOOST_TEST(detail::nfc("a\u0302\u0323") == "\u1EAD");
  BOOST_TEST(detail::nfc("q\u0307\u0323") == "q\u0323\u0307");         // canonical reordering
  BOOST_TEST(detail::nfc("\u0301a") == "\u0301a");                     // leading mark stays
  // A tokenizer with the NFC normalizer encodes decomposed and precomposed text alike.
  json j = make_json({});
  j["normalizer"] = {{"type", "NFC"}};
  auto tok = load(j);
  BOOST_TEST(tok.encode("e\u0301") == tok.encode("\u00E9"), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(qwen2_regex_splits_like_oniguruma) {
  auto re = detail::regex::compile(detail::qwen2_pattern);
  BOOST_TEST_REQUIRE(re.has_value(), (re ? "" : re.error()));
  auto pieces = [&](std::string_view s) {
    std::vector<std::string> out;
    for (auto [b, e] : re->find_all(s))
      out.emplace_back(s.substr(b, e - b));
    return out;
  };
  using v = std::vector<std::string>;
  // (?i:'s|...) matches upper case; \p{N} takes one digit; \s+(?!\S) leaves one space for the word.
  BOOST_TEST(pieces("IT'S 2024") == (v{"IT", "'S", " ", "2", "0", "2", "4"}),
             boost::test_tools::per_element());
  BOOST_TEST(pieces("a   b") == (v{"a", "  ", " b"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("x\n\n  y") == (v{"x", "\n\n", " ", " y"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("caf\u00E9 \u4E2D\u6587!") == (v{"caf\u00E9", " \u4E2D\u6587", "!"}),
             boost::test_tools::per_element());
  BOOST_TEST(pieces("...\n") == (v{"...\n"}), boost::test_tools::per_element());
}

// The engine's matching rules, each against what Oniguruma (tokenizers) gives for the same
// pattern and text (worked out with the `tokenizers` package's Split pre-tokenizer).
BOOST_AUTO_TEST_CASE(regex_engine_matches_like_oniguruma) {
  auto pieces = [](std::string_view pattern, std::string_view s) {
    auto re = detail::regex::compile(pattern);
    BOOST_TEST_REQUIRE(re.has_value(), (re ? "" : re.error()));
    std::vector<std::string> out;
    for (auto [b, e] : re->find_all(s))
      out.emplace_back(s.substr(b, e - b));
    return out;
  };
  using v = std::vector<std::string>;
  // Leftmost-first alternation, not longest: "a" wins over "ab".
  BOOST_TEST(pieces("a|ab", "ab") == (v{"a"}), boost::test_tools::per_element());
  // Greedy and lazy repeats, counted repeats.
  BOOST_TEST(pieces("\\p{N}{1,3}", "1234567") == (v{"123", "456", "7"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("a+?", "aaa") == (v{"a", "a", "a"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("a{2,}?b", "aaab") == (v{"aaab"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("(?:ab){2}", "ababab") == (v{"abab"}), boost::test_tools::per_element());
  // A repeat gives characters back for what follows it; a negative lookahead after \s+.
  BOOST_TEST(pieces("\\s+(?!\\S)|\\s+", "a   b") == (v{"  ", " "}), boost::test_tools::per_element());
  BOOST_TEST(pieces("[a-z]+c", "abcabc") == (v{"abcabc"}), boost::test_tools::per_element());
  // Lookahead with a class inside a repeated group (the o200k / Tekken style).
  BOOST_TEST(pieces("((?=[\\p{L}])([^a-z]))+", "ABcD") == (v{"AB", "D"}), boost::test_tools::per_element());
  // (?i) folds ASCII letters and the long s (U+017F) onto s; (?i) inline lasts to the group end.
  BOOST_TEST(pieces("(?i:'s)", "'S 's '\u017F") == (v{"'S", "'s", "'\u017F"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("(?:(?i)x)y", "XyXY") == (v{"Xy"}), boost::test_tools::per_element());
  // Classes: escapes, ranges, negation, properties inside brackets, a literal '-' at the end.
  BOOST_TEST(pieces("[\\-a-c]+", "-abcd") == (v{"-abc"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("[^\\s\\p{L}]+", "ab..12 x") == (v{"..12"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("[\\S]", " x") == (v{"x"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("[a-]+", "a-a") == (v{"a-a"}), boost::test_tools::per_element());
  // Hex escapes and literal non-ASCII ranges (DeepSeek-V3's CJK split).
  BOOST_TEST(pieces("[\\x{4e00}-\\x{9fa5}]+", "ab\u4E2D\u6587cd") == (v{"\u4E2D\u6587"}),
             boost::test_tools::per_element());
  BOOST_TEST(pieces("[\u4E00-\u9FA5]+", "\u4E2D\u6587") == (v{"\u4E2D\u6587"}), boost::test_tools::per_element());
  // A brace that is not a quantifier is a literal.
  BOOST_TEST(pieces("a{,", "a{,") == (v{"a{,"}), boost::test_tools::per_element());
  // Line anchors, and . stops at a newline.
  BOOST_TEST(pieces("^.", "ab\ncd") == (v{"a", "c"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("\\s+$", "a  \nb ") == (v{"  ", " "}), boost::test_tools::per_element());
  // Empty matches: reported, then skipped right after a match, as onig's find_iter (Split drops
  // the empty pieces).
  BOOST_TEST(pieces("a*", "baa") == (v{"", "aa"}), boost::test_tools::per_element());
  // Unicode 16 letters and digits are \p{L} / \p{N}; U+180E is not \s.
  BOOST_TEST(pieces("\\p{L}+", "a\U00031350\U00010D50\u1C89b") == (v{"a\U00031350\U00010D50\u1C89b"}),
             boost::test_tools::per_element());
  BOOST_TEST(pieces("\\p{N}+", "1\U00010D40") == (v{"1\U00010D40"}), boost::test_tools::per_element());
  BOOST_TEST(pieces("\\s+", "  \u180E ") == (v{"  ", " "}), boost::test_tools::per_element());
  // A long run stays linear: one stack entry for the whole repeat.
  const std::string spaces(200000, ' ');
  BOOST_TEST(pieces("\\s+(?!\\S)|\\s+", spaces + "x").size() == 2u);
  // Catastrophic backtracking stops at Oniguruma's retry limit and leaves the rest unmatched.
  BOOST_TEST(pieces("(a|a)*b", std::string(40, 'a')).empty());
  BOOST_TEST(pieces("x|(a|a)*b", "x" + std::string(40, 'a') + "x") == (v{"x"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(load_errors_name_the_json_path) {
  auto error_contains = [](const json& j, const std::string& what) {
    const std::string e = load_error(j);
    BOOST_TEST(e.find(what) != std::string::npos, "error \"" << e << "\" lacks \"" << what << "\"");
  };
  const json good = make_json({{"a", "b"}});
  error_contains(json::array(), "(root)");
  auto edit = [&](auto fn) {
    json j = good;
    fn(j);
    return j;
  };
  error_contains(edit([](json& j) { j["version"] = "2.0"; }), "version");
  error_contains(edit([](json& j) { j["truncation"] = {{"max_length", 8}}; }), "truncation");
  error_contains(edit([](json& j) { j["padding"] = {{"strategy", "BatchLongest"}}; }), "padding");
  error_contains(edit([](json& j) { j.erase("model"); }), "model: missing");
  error_contains(edit([](json& j) { j["model"]["type"] = "WordPiece"; }), "model.type");
  error_contains(edit([](json& j) { j["model"]["dropout"] = 0.1; }), "model.dropout");
  error_contains(edit([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
                 "model.continuing_subword_prefix");
  error_contains(edit([](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }),
                 "model.end_of_word_suffix");
  error_contains(edit([](json& j) { j["model"]["vocab"]["a"] = "zero"; }), "model.vocab[\"a\"]");
  error_contains(edit([](json& j) { j["model"]["vocab"]["a"] = -4; }), "model.vocab[\"a\"]");
  error_contains(edit([](json& j) { j["model"]["vocab"]["zz"] = 0; }), "is also used by");
  error_contains(edit([](json& j) { j["model"].erase("merges"); }), "model.merges: missing");
  error_contains(edit([](json& j) { j["model"]["merges"][0] = 7; }), "model.merges[0]");
  error_contains(edit([](json& j) { j["model"]["merges"][0] = "a  b"; }), "model.merges[0]");
  error_contains(edit([](json& j) { j["model"]["merges"].push_back({"a", "\u4E2D"}); }), "model.merges[1]");
  error_contains(edit([](json& j) { j["model"]["merges"].push_back({"b", "a"}); }), "merged token \"ba\"");
  error_contains(edit([](json& j) { j["model"]["unk_token"] = "<unk>"; }), "model.unk_token");
  error_contains(edit([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }), "normalizer.type");
  error_contains(edit([](json& j) {
                   j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}};
                 }),
                 "normalizer.normalizers[0].type");
  error_contains(edit([](json& j) { j.erase("pre_tokenizer"); }), "pre_tokenizer: missing");
  error_contains(edit([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }), "pre_tokenizer.type");
  const json split = {
    {"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  auto seq = [](json a, json b) { return json{{"type", "Sequence"}, {"pretokenizers", {a, b}}}; };
  const json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  BOOST_TEST(
    bpe_tokenizer::from_json(edit([&](json& j) { j["pre_tokenizer"] = seq(split, bl); })).has_value());
  error_contains(edit([&](json& j) { j["pre_tokenizer"] = seq(bl, split); }), "must end with exactly one ByteLevel");
  error_contains(edit([&](json& j) { j["pre_tokenizer"] = split; }), "must end with exactly one ByteLevel");
  error_contains(edit([&](json& j) {
                   json s = split;
                   s["behavior"] = "Sideways";
                   j["pre_tokenizer"] = seq(s, bl);
                 }),
                 "pre_tokenizer.pretokenizers[0].behavior");
  error_contains(edit([&](json& j) {
                   json s = split;
                   s["pattern"] = {{"Regex", "(unclosed"}};
                   j["pre_tokenizer"] = seq(s, bl);
                 }),
                 "pre_tokenizer.pretokenizers[0].pattern.Regex: the pattern is not supported: "
                 "missing ')'");
  // Every construct outside the supported subset is refused, naming it.
  for (const auto& refused : std::vector<std::pair<std::string, std::string>>{
         {"(a)\\1", "escape \\1"},
         {"(?<=a)b", "lookbehind"},
         {"a++", "possessive"},
         {"[a[b]]", "nested classes"},
         {"[a&&b]", "intersection"},
         {"\\p{Han}", "\\p{Han}"},
         {"(?m:a)", "the group (?m"},
         {"(?i-x:a)", "only the i flag"},
         {"(?i:\u00E9)", "non-ASCII letters"},
         {"(a*)*", "empty string"},
         {"a{2000}", "above 1000"},
         {"*a", "nothing to repeat"},
         {"\\x{D800}", "not a Unicode scalar"},
         {"a)", "unmatched ')'"},
         {"[a", "missing ']'"},
       }) {
    const std::string& pattern = refused.first; // not a structured binding: lambdas capture it
    error_contains(edit([&](json& j) {
                     json s = split;
                     s["pattern"] = {{"Regex", pattern}};
                     j["pre_tokenizer"] = seq(s, bl);
                   }),
                   refused.second);
  }
  error_contains(edit([&](json& j) {
                   json s = split;
                   s.erase("invert");
                   j["pre_tokenizer"] = seq(s, bl);
                 }),
                 "pre_tokenizer.pretokenizers[0].invert");
  error_contains(edit([](json& j) { j.erase("decoder"); }), "decoder: missing");
  error_contains(edit([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }), "decoder.type");
  error_contains(edit([](json& j) {
                   j["post_processor"] = {{"type", "TemplateProcessing"},
                                          {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}}};
                 }),
                 "post_processor.type");
  error_contains(edit([](json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; }), "post_processor.type");
  error_contains(edit([](json& j) { j["added_tokens"] = json::array({added_token(300, "<x>", true)}); }), "added_tokens[0].id");
  error_contains(edit([](json& j) { j["added_tokens"] = json::array({added_token(5, "<x>", true)}); }), "added_tokens[0].id");
  error_contains(edit([](json& j) {
                   j["added_tokens"] = {added_token(257, "<x>", true), added_token(258, "<x>", true)};
                 }),
                 "added_tokens[1].content");
  error_contains(edit([](json& j) {
                   json t = added_token(257, "<x>", true);
                   t["lstrip"] = "yes";
                   j["added_tokens"] = json::array({t});
                 }),
                 "added_tokens[0].lstrip");
}

BOOST_AUTO_TEST_CASE(from_file_errors_name_the_file) {
  auto missing = bpe_tokenizer::from_file("/nonexistent/tokenizer.json");
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().find("/nonexistent/tokenizer.json: cannot open") != std::string::npos);

  const auto path = std::filesystem::temp_directory_path() / "rlserve_bpe_tokenizer_test.json";
  {
    std::ofstream(path) << "{\"model\": ";
  }
  auto broken = bpe_tokenizer::from_file(path);
  BOOST_TEST_REQUIRE(!broken.has_value());
  BOOST_TEST(broken.error().find("not valid JSON") != std::string::npos);
  {
    json j = make_json({});
    j["model"]["type"] = "Unigram";
    std::ofstream(path) << j.dump();
  }
  auto unsupported = bpe_tokenizer::from_file(path);
  BOOST_TEST_REQUIRE(!unsupported.has_value());
  BOOST_TEST(unsupported.error().find(path.string() + ": model.type") == 0u);
  std::filesystem::remove(path);
}

// Not a pass/fail test: prints encode throughput on a few KB of mixed text (the tiny tokenizer's
// corpus, 4096-entry vocab), cold (empty BPE cache) and warm.
BOOST_AUTO_TEST_CASE(encode_throughput) {
  auto text_json = rlserve::model::tiny_tokenizer_json(4096);
  BOOST_TEST_REQUIRE(text_json.has_value());
  const auto text = std::string(rlserve::model::tiny_tokenizer_corpus());
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  std::size_t tokens = 0;
  auto t0 = clock::now();
  auto cold_tok = load(json::parse(*text_json));
  auto t1 = clock::now();
  tokens = cold_tok.encode(text).size();
  auto t2 = clock::now();
  const int reps = 200;
  for (int i = 0; i < reps; ++i)
    tokens = cold_tok.encode(text).size();
  auto t3 = clock::now();
  const double mb = double(text.size()) / 1e6;
  BOOST_TEST_MESSAGE("bpe_tokenizer: load " << seconds(t1 - t0) * 1e3 << " ms; encode of " << text.size()
                                            << " bytes -> " << tokens << " tokens: cold "
                                            << mb / seconds(t2 - t1) << " MB/s, warm "
                                            << mb * reps / seconds(t3 - t2) << " MB/s");
  BOOST_TEST(tokens > 0u);
}

BOOST_AUTO_TEST_SUITE_END()
