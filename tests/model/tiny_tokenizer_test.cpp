// tiny_tokenizer: the file make-model ships loads back with exactly vocab_size ids, the specials
// at the end, a real compression of text, and byte-identical output for the same size. (That the
// file also loads in Python `tokenizers` and tokenizes identically there is
// tests/python/test_tokenizer_parity.py.)
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include "tests/support/test_support.hpp"
#include <nlohmann/json.hpp>

#include "model/bpe_tokenizer.hpp"
#include "model/tiny_tokenizer.hpp"

using namespace rlserve::model;
namespace fs = std::filesystem;

namespace {

using rlserve::test::temp_dir;
using rlserve::test::why;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}


} // namespace

BOOST_AUTO_TEST_SUITE(tiny_tokenizer_test)

BOOST_AUTO_TEST_CASE(written_files_load_with_the_asked_vocab) {
  temp_dir dir;
  for (int32_t n : {k_tiny_tokenizer_min_vocab, 512, 1024, 5000}) {
    const fs::path out = dir.path / std::to_string(n);
    auto info = write_tiny_tokenizer(out, n);
    BOOST_TEST_REQUIRE(info.has_value(), (info ? "" : info.error()));
    BOOST_TEST(info->vocab_size == n);
    BOOST_TEST(info->eos_token_id == n - 3);
    BOOST_TEST(info->special_tokens == (std::vector<std::string>{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}),
               boost::test_tools::per_element());
    BOOST_TEST(fs::exists(out / "tokenizer_config.json"));
    auto tok = bpe_tokenizer::from_file(out / "tokenizer.json");
    BOOST_TEST_REQUIRE(tok.has_value(), (tok ? "" : tok.error()));
    BOOST_TEST(tok->vocab_size() == n);
    BOOST_TEST(tok->token_id("<|endoftext|>").value() == n - 3);
    BOOST_TEST(tok->token_id("<|im_start|>").value() == n - 2);
    BOOST_TEST(tok->token_id("<|im_end|>").value() == n - 1);
    BOOST_TEST(tok->special_token_ids() == (std::vector<int32_t>{n - 3, n - 2, n - 1}), boost::test_tools::per_element());
    // Ids 0..255 are the bytes, in byte order.
    BOOST_TEST(tok->token_bytes(0).value() == std::string(1, '\0'));
    BOOST_TEST(tok->token_bytes(' ').value() == " ");
    BOOST_TEST(tok->token_bytes(255).value() == "\xFF");
    for (int32_t id = 0; id < n; ++id)
      BOOST_TEST_REQUIRE(tok->token_text(id).has_value()); // no gaps

    const std::string chat = "<|im_start|>user\nHello, world! 😀<|im_end|>\n";
    const auto ids = tok->encode(chat);
    BOOST_TEST(ids.front() == n - 2);
    BOOST_TEST(tok->decode(ids, false) == chat);
    const std::string corpus(tiny_tokenizer_corpus());
    BOOST_TEST(tok->decode(tok->encode(corpus)) == corpus);

    auto config = nlohmann::json::parse(read_file(out / "tokenizer_config.json"));
    BOOST_TEST(config["eos_token"] == "<|endoftext|>");
    BOOST_TEST(config["added_tokens_decoder"].contains(std::to_string(n - 1)));
  }
}

BOOST_AUTO_TEST_CASE(merges_are_learned_from_the_corpus) {
  auto text = tiny_tokenizer_json(1024);
  BOOST_TEST_REQUIRE(text.has_value());
  auto j = nlohmann::json::parse(*text);
  BOOST_TEST(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == std::string(bpe_detail::qwen2_pattern));
  BOOST_TEST(j["normalizer"]["type"] == "NFC");
  // The most frequent pairs of the corpus come first: double space (indentation) and " t".
  const auto& merges = j["model"]["merges"];
  BOOST_TEST(merges[0] == nlohmann::json({"\u0120", "\u0120"}));
  BOOST_TEST(merges[1] == nlohmann::json({"\u0120", "t"}));
  auto tok = bpe_tokenizer::from_json(j);
  BOOST_TEST_REQUIRE(tok.has_value());
  // Learned merges compress text: English prose needs far fewer tokens than bytes.
  const std::string prose = "The weather today is mild and clear, and the students are happy.";
  BOOST_TEST(tok->encode(prose).size() * 2 < prose.size());
}

BOOST_AUTO_TEST_CASE(same_size_gives_byte_identical_files) {
  temp_dir dir;
  BOOST_TEST_REQUIRE(write_tiny_tokenizer(dir.path / "a", 777).has_value());
  BOOST_TEST_REQUIRE(write_tiny_tokenizer(dir.path / "b", 777).has_value());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    BOOST_TEST(read_file(dir.path / "a" / f) == read_file(dir.path / "b" / f));
  BOOST_TEST(*tiny_tokenizer_json(777) == read_file(dir.path / "a" / "tokenizer.json"));
  BOOST_TEST(*tiny_tokenizer_json(778) != *tiny_tokenizer_json(777));
}

BOOST_AUTO_TEST_CASE(large_vocab_is_padded_with_byte_pairs) {
  // The corpus offers ~1,300 merges; beyond them come byte pairs in byte order, starting with
  // control bytes that text rarely contains.
  auto text = tiny_tokenizer_json(4096);
  BOOST_TEST_REQUIRE(text.has_value());
  auto tok = bpe_tokenizer::from_json(nlohmann::json::parse(*text));
  BOOST_TEST_REQUIRE(tok.has_value());
  BOOST_TEST(tok->vocab_size() == 4096);
  BOOST_TEST(tok->encode(std::string("\x00\x00", 2)).size() == 1u);
}

BOOST_AUTO_TEST_CASE(bad_sizes_and_paths_fail_clearly) {
  for (int32_t n : {0, 259, k_tiny_tokenizer_max_vocab + 1}) {
    auto r = tiny_tokenizer_json(n);
    BOOST_TEST_REQUIRE(!r.has_value());
    BOOST_TEST(r.error().find("vocab_size " + std::to_string(n)) != std::string::npos);
  }
  temp_dir dir;
  std::ofstream(dir.path / "file") << "x";
  auto r = write_tiny_tokenizer(dir.path / "file" / "sub", 512);
  BOOST_TEST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().find("file/sub") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
