// `rlserve tokenize`: run a tokenizer.json outside the engine — encode text, decode ids, show the
// streamed pieces — and write the tiny tokenizer make-model ships. The Python parity test
// (tests/python/test_tokenizer_parity.py) drives it with --json and compares every line with the
// `tokenizers` package.
//
//   rlserve tokenize --tokenizer DIR/tokenizer.json --text "Hello world"      -> 9707,1879
//   rlserve tokenize --tokenizer DIR --decode 9707,1879                       -> Hello world
//   rlserve tokenize --tokenizer DIR --text-file prompts.jsonl --json-lines --json
//   rlserve tokenize --write-tiny DIR --vocab-size 1024
//   rlserve tokenize --tokenizer DIR --text-file corpus.jsonl --json-lines --time-repeats 5
//     (encode throughput alone, for benchmarks/tokenizer_bench.py)
#include <chrono>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/command.hpp"
#include "model/bpe_tokenizer.hpp"
#include "model/tiny_tokenizer.hpp"

namespace rlserve::apps {

namespace {

struct tokenize_options {
  std::string tokenizer;
  std::string text;
  std::string text_file;
  std::string decode;
  std::string decode_file;
  std::string write_tiny;
  int32_t vocab_size = 0;
  bool json = false;
  bool json_lines = false;
  bool keep_special = false;
  int32_t time_repeats = 0;
};

std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::size_t i = 0;
  while (i < list.size()) {
    if (list[i] == ',' || list[i] == ' ' || list[i] == '\t' || list[i] == '[' || list[i] == ']') {
      ++i;
      continue;
    }
    int32_t v = 0;
    auto [end, ec] = std::from_chars(list.data() + i, list.data() + list.size(), v);
    if (ec != std::errc() || end == list.data() + i)
      throw command_failed(fmt::format("--decode: cannot read an id at \"{}\"", list.substr(i, 12)));
    ids.push_back(v);
    i = std::size_t(end - list.data());
  }
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  return fmt::format("{}", fmt::join(ids, ","));
}

// One result line: the ids, the full decode, and what incremental_decoder streamed (one entry
// per id, then the finish() rest when there is one), so a test can check that the pieces add up.
// Printed ASCII-only (non-ASCII \u-escaped): a raw U+2028 or U+0085 inside the JSON would split
// the line for readers that split on every Unicode line break, as Python's splitlines() does.
nlohmann::json result_json(const model::bpe_tokenizer& tok, const std::vector<int32_t>& ids,
                           bool skip_special) {
  model::incremental_decoder dec(tok, skip_special);
  nlohmann::json stream = nlohmann::json::array();
  for (int32_t id : ids)
    stream.push_back(dec.push(id));
  if (auto rest = dec.finish(); !rest.empty())
    stream.push_back(rest);
  return {{"ids", ids}, {"text", tok.decode(ids, skip_special)}, {"stream", std::move(stream)}};
}

// Encodes every text `repeats` times on this thread and prints one JSON line: the bytes encoded,
// the seconds the encoding took (reading the file not counted) and MB/s.
void print_throughput(const model::bpe_tokenizer& tok, const std::vector<std::string>& texts,
                      int32_t repeats) {
  std::size_t bytes = 0, ids = 0;
  for (const auto& t : texts)
    bytes += t.size();
  const auto start = std::chrono::steady_clock::now();
  for (int32_t r = 0; r < repeats; ++r)
    for (const auto& t : texts)
      ids += tok.encode(t).size();
  const double seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double total = double(bytes) * repeats;
  std::cout << nlohmann::json{{"strings", texts.size()}, {"bytes", bytes},   {"repeats", repeats},
                              {"ids", ids / std::size_t(repeats)},          {"seconds", seconds},
                              {"mb_per_s", seconds > 0 ? total / seconds / 1e6 : 0.0}}
                 .dump()
            << '\n';
}

model::bpe_tokenizer load(const std::string& path) {
  std::filesystem::path p = path;
  if (std::filesystem::is_directory(p))
    p /= "tokenizer.json";
  auto tok = model::bpe_tokenizer::from_file(p);
  if (!tok)
    throw command_failed(tok.error());
  return std::move(*tok);
}

void run(const tokenize_options& o) {
  if (!o.write_tiny.empty()) {
    auto info = model::write_tiny_tokenizer(o.write_tiny, o.vocab_size);
    if (!info)
      throw command_failed(info.error());
    std::printf("%s: tokenizer.json, tokenizer_config.json (vocab_size %d, eos %d)\n",
                o.write_tiny.c_str(), info->vocab_size, info->eos_token_id);
    return;
  }
  if (o.tokenizer.empty())
    throw command_failed("--tokenizer is required (unless --write-tiny)");
  const model::bpe_tokenizer tok = load(o.tokenizer);
  const bool skip = !o.keep_special;

  auto emit_encode = [&](std::string_view text) {
    const auto ids = tok.encode(text);
    if (o.json)
      std::cout << result_json(tok, ids, skip).dump(-1, ' ', true) << '\n';
    else
      std::cout << join_ids(ids) << '\n';
  };

  if (!o.decode.empty()) {
    const auto ids = parse_ids(o.decode);
    if (o.json)
      std::cout << result_json(tok, ids, skip).dump(-1, ' ', true) << '\n';
    else
      std::cout << tok.decode(ids, skip) << '\n';
  } else if (!o.decode_file.empty()) {
    std::ifstream in(o.decode_file, std::ios::binary);
    if (!in)
      throw command_failed(o.decode_file + ": cannot open");
    std::string line;
    while (std::getline(in, line)) {
      const auto ids = parse_ids(line);
      if (o.json)
        std::cout << result_json(tok, ids, skip).dump(-1, ' ', true) << '\n';
      else
        std::cout << tok.decode(ids, skip) << '\n';
    }
  } else if (!o.text_file.empty()) {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in)
      throw command_failed(o.text_file + ": cannot open");
    std::vector<std::string> timed; // the texts, when only the throughput is printed
    std::string line;
    for (std::size_t n = 1; std::getline(in, line); ++n) {
      std::string text;
      if (!o.json_lines) {
        text = std::move(line);
      } else {
        if (line.empty())
          continue;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
          throw command_failed(fmt::format("{}:{}: not a JSON string: {}", o.text_file, n, e.what()));
        }
        if (!j.is_string())
          throw command_failed(fmt::format("{}:{}: expected a JSON string", o.text_file, n));
        text = j.get<std::string>();
      }
      if (o.time_repeats > 0)
        timed.push_back(std::move(text));
      else
        emit_encode(text);
    }
    if (o.time_repeats > 0)
      print_throughput(tok, timed, o.time_repeats);
  } else {
    emit_encode(o.text);
  }
  std::cout.flush();
}

void add_tokenize(CLI::App& app) {
  auto o = std::make_shared<tokenize_options>();
  auto* cmd = app.add_subcommand("tokenize", "Encode or decode with a tokenizer.json (byte-level BPE), "
                                             "or write the tiny tokenizer make-model uses");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json, or a model directory holding one");
  auto* text = cmd->add_option("--text", o->text, "text to encode (prints comma-separated ids)");
  auto* file = cmd->add_option("--text-file", o->text_file, "encode each line of this file");
  auto* dec = cmd->add_option("--decode", o->decode, "ids to decode, e.g. 1,2,3");
  auto* dec_file = cmd->add_option("--decode-file", o->decode_file,
                                   "decode each line of this file (comma-separated ids)");
  auto* tiny = cmd->add_option("--write-tiny", o->write_tiny,
                               "write the tiny tokenizer (tokenizer.json + tokenizer_config.json) to DIR");
  auto* size = cmd->add_option("--vocab-size", o->vocab_size, "vocab size for --write-tiny");
  cmd->add_flag("--json", o->json, "one JSON object per input: {\"ids\", \"text\", \"stream\"}");
  cmd->add_flag("--json-lines", o->json_lines,
                "each line of --text-file is a JSON string (so texts may hold newlines)");
  cmd->add_flag("--keep-special", o->keep_special, "decode special tokens instead of skipping them");
  auto* timing = cmd->add_option("--time-repeats", o->time_repeats,
                                 "encode every line of --text-file N times and print the throughput "
                                 "(JSON) instead of ids")
                   ->check(CLI::PositiveNumber);
  timing->needs(file);
  text->excludes(file)->excludes(dec)->excludes(dec_file)->excludes(tiny);
  file->excludes(dec)->excludes(dec_file)->excludes(tiny);
  dec->excludes(dec_file)->excludes(tiny);
  dec_file->excludes(tiny);
  tiny->needs(size);
  cmd->callback([o, text, file, dec, dec_file, tiny] {
    // --text "" is a valid input (the empty string), so ask CLI11 what was given.
    if (text->count() + file->count() + dec->count() + dec_file->count() + tiny->count() == 0)
      throw command_failed("give --text, --text-file, --decode or --decode-file (with --tokenizer), "
                           "or --write-tiny");
    run(*o);
  });
}

const command_registrar registrar{80, add_tokenize};

} // namespace

} // namespace rlserve::apps
