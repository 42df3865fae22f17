// `rlserve forward`: the logits of every position of one or more prompts, as a float32 .npy
// [sum of lengths, vocab], prompts in order. The Python parity tests compare them with an
// independent numpy implementation of Qwen3 (CPU) and with transformers (tests/gpu). On the GPU
// the prompts run as one batch, each its own sequence in the paged KV pool.
#include <algorithm>
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
#include "model/qwen3_gpu.hpp"

namespace rlserve::apps {

namespace {

struct forward_options {
  std::string model;
  std::string input_ids; // "1,2,3" or "1,2,3;4,5" (several prompts)
  std::string out;
  std::string device = "cpu";
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

std::vector<std::vector<int32_t>> parse_prompts(const std::string& text) {
  std::vector<std::vector<int32_t>> prompts;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t semi = text.find(';', pos);
    if (semi == std::string::npos)
      semi = text.size();
    prompts.push_back(parse_ids(text.substr(pos, semi - pos)));
    pos = semi + 1;
  }
  return prompts;
}

// All prompts as one batch on the GPU: blocks handed out in order from a pool just big enough.
std::vector<float> forward_on_gpu(const model::qwen3_model& m, const std::string& device,
                                  const std::vector<std::vector<int32_t>>& prompts) {
  model::gpu_options g;
  if (device.rfind("cuda:", 0) == 0)
    g.device = std::stoi(device.substr(5));
  int64_t tokens = 0;
  for (const auto& p : prompts)
    tokens += static_cast<int64_t>(p.size());
  g.kv_num_blocks = tokens / g.kv_block_size + static_cast<int64_t>(prompts.size()) + 1;
  g.max_batch_tokens = std::max<int64_t>(tokens, 1);
  g.max_sequences = static_cast<int64_t>(prompts.size());
  auto gpu = model::qwen3_gpu_model::create(m, g);
  if (!gpu)
    throw command_failed(gpu.error());
  std::vector<model::kv_sequence> kv(prompts.size());
  std::vector<model::forward_item> items;
  int32_t next_block = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto n = static_cast<int64_t>(prompts[i].size());
    for (int64_t b = 0; b * g.kv_block_size < n; ++b)
      kv[i].blocks.push_back(next_block++);
    items.push_back({&kv[i], prompts[i], n});
  }
  std::vector<float> logits;
  if (auto s = (*gpu)->forward(items, logits); !s)
    throw command_failed(s.error());
  return logits;
}

void run_forward(const forward_options& o) {
  const auto prompts = parse_prompts(o.input_ids);
  auto config = model::load_model_config(o.model);
  if (!config)
    throw command_failed(config.error());
  auto ckpt = model::checkpoint::open(o.model);
  if (!ckpt)
    throw command_failed(ckpt.error());
  model::qwen3_load_options lo;
  lo.compute_copies = o.device == "cpu"; // the GPU forward reads the checkpoint's own bytes
  auto m = model::qwen3_model::load(*config, *ckpt, lo);
  if (!m)
    throw command_failed(m.error());
  std::vector<float> logits;
  int64_t T = 0;
  for (const auto& p : prompts)
    T += static_cast<int64_t>(p.size());
  if (o.device == "cpu") {
    for (const auto& p : prompts) {
      auto l = m->forward_all(p);
      if (!l)
        throw command_failed(l.error());
      logits.insert(logits.end(), l->begin(), l->end());
    }
  } else if (o.device == "cuda" || o.device.rfind("cuda:", 0) == 0) {
    logits = forward_on_gpu(*m, o.device, prompts);
  } else {
    throw command_failed(fmt::format("--device: '{}' is not cpu, cuda or cuda:N", o.device));
  }
  write_npy(o.out, logits, T, config->vocab_size);
  std::printf("wrote logits [%lld, %lld] float32 of %zu prompt(s) on %s to %s\n",
              static_cast<long long>(T), static_cast<long long>(config->vocab_size),
              prompts.size(), o.device.c_str(), o.out.c_str());
}

void add_forward(CLI::App& app) {
  auto options = std::make_shared<forward_options>();
  auto* cmd = app.add_subcommand("forward", "Run prompts through the model and save the logits "
                                            "of every position as .npy [T, vocab]");
  cmd->add_option("--model", options->model, "Model directory")->required();
  cmd->add_option("--input-ids", options->input_ids,
                  "Token ids, comma-separated; several prompts separated by ';': 1,2,3;4,5")
    ->required();
  cmd->add_option("--device", options->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--out", options->out, "Output .npy file")->required();
  cmd->callback([options] { run_forward(*options); });
}

const command_registrar registrar{90, add_forward};

} // namespace

} // namespace rlserve::apps
