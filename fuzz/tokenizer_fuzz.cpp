// model/bpe_tokenizer.hpp's tokenizer.json loader on untrusted files. A tokenizer that loads is
// also used: a fixed text and its ids through encode/decode and the incremental decoder, and the
// first ids of the vocabulary, so tables built from hostile JSON are exercised as well.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "model/bpe_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using rlserve::model::bpe_tokenizer;
  auto path = rlserve_fuzz::write_scratch_file("tokenizer.json", data, size);
  auto tok = bpe_tokenizer::from_file(path);
  if (!tok)
    return 0;
  static const std::string text =
    "Hello world! 123 \xe4\xbd\xa0\xe5\xa5\xbd <|im_start|>user\n\xf0\x9f\x98\x80 \xff end";
  auto ids = tok->encode(text);
  std::vector<int32_t> probe = ids;
  for (int32_t id = -1; id < std::min<int32_t>(tok->vocab_size(), 64); ++id)
    probe.push_back(id);
  probe.push_back(tok->vocab_size());
  (void)tok->decode(probe, false);
  std::string streamed;
  rlserve::model::incremental_decoder dec(*tok);
  for (auto id : probe) {
    (void)tok->token_text(id);
    (void)tok->token_bytes(id);
    streamed += dec.push(id);
  }
  streamed += dec.finish();
  if (streamed != tok->decode(probe))
    rlserve_fuzz::broken("incremental decoding differs from decode");
  return 0;
}
