// `rlserve forward`: the logits of every position of one prompt, as a float32 .npy [T, vocab].
// The Python parity test compares them with an independent numpy implementation of Qwen3.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/command.hpp"
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/qwen3.hpp"

namespace rlserve::apps {

namespace {

struct forward_options {
  std::string model;
  std::string input_ids; // "1,2,3"
  std::string out;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos)
      comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0 || v > INT32_MAX)
      throw command_failed(fmt::format("--input-ids: '{}' is not a token id (expected "
                                       "comma-separated non-negative integers)", item));
    ids.push_back(static_cast<int32_t>(v));
    pos = comma + 1;
  }
  return ids;
}

// NumPy .npy version 1.0: magic, header length (u16 LE), a Python dict literal padded with
// spaces and a newline so the data starts 64-byte aligned, then the raw little-endian floats.
void write_npy(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
                                   rows, cols);
  const std::size_t preamble = 10; // magic (6) + version (2) + header length (2)
  header.append(63 - (preamble + header.size()) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    throw command_failed(fmt::format("{}: cannot open for writing", path));
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  const auto len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out)
    throw command_failed(fmt::format("{}: write failed", path));
}

void run_forward(const forward_options& o) {
  const auto ids = parse_ids(o.input_ids);
  auto config = model::load_model_config(o.model);
  if (!config)
    throw command_failed(config.error());
  auto ckpt = model::checkpoint::open(o.model);
  if (!ckpt)
    throw command_failed(ckpt.error());
  auto m = model::qwen3_model::load(*config, *ckpt);
  if (!m)
    throw command_failed(m.error());
  auto logits = m->forward_all(ids);
  if (!logits)
    throw command_failed(logits.error());
  const auto T = static_cast<int64_t>(ids.size());
  write_npy(o.out, *logits, T, config->vocab_size);
  std::printf("wrote logits [%lld, %lld] float32 to %s\n", static_cast<long long>(T),
              static_cast<long long>(config->vocab_size), o.out.c_str());
}

void add_forward(CLI::App& app) {
  auto options = std::make_shared<forward_options>();
  auto* cmd = app.add_subcommand("forward", "Run one prompt through the model and save the "
                                            "logits of every position as .npy [T, vocab]");
  cmd->add_option("--model", options->model, "Model directory")->required();
  cmd->add_option("--input-ids", options->input_ids, "Token ids, comma-separated: 1,2,3")
    ->required();
  cmd->add_option("--out", options->out, "Output .npy file")->required();
  cmd->callback([options] { run_forward(*options); });
}

const command_registrar registrar{90, add_forward};

} // namespace

} // namespace rlserve::apps
