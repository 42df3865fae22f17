// Writes the seed corpora of fuzz/corpus/ from the project's own samples: the JSON test samples
// of tests/messages/message_samples.hpp (each prefixed with its decoder's selector byte,
// json_codec_selectors.hpp), make-model's tiny configs and tokenizer, small safetensors files,
// websocket text and binary frames as the client library writes them, HTTP requests, and the
// PyTorch CUDA IPC pickles of tests/data/torch_ipc (each prefixed with its form byte).
//
//   write_fuzz_seeds fuzz/corpus        (writes <target>/ folders; existing files are replaced;
//                                        the pickles are read from <corpus>/../../tests/data)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "caf/message.hpp"
#include "caf/type_id.hpp"
#include "fuzz/json_codec_selectors.hpp"
#include "messages/json_codec.hpp"
#include "messages/operations.hpp"
#include "messages/type_ids.hpp"
#include "model/config.hpp"
#include "model/make_model.hpp"
#include "model/safetensors.hpp"
#include "model/tiny_tokenizer.hpp"
#include "net/protocol.hpp"
#include "tests/messages/message_samples.hpp"

namespace {

using namespace rlserve;
namespace fs = std::filesystem;

template <class T>
std::string_view short_name() {
  std::string_view name = caf::type_name<T>::value;
  if (auto pos = name.rfind("::"); pos != std::string_view::npos)
    name.remove_prefix(pos + 2);
  return name;
}

// The selector of the decoder of the type called `name`; -1 when nothing decodes it (a bug in
// the lists below).
int selector_of(std::string_view name) {
  const auto codecs = all_codecs();
  for (std::size_t i = 0; i < codecs.size(); ++i) {
    if (codecs[i].request_type == name)
      return static_cast<int>(2 * i);
    if (codecs[i].reply_type == name)
      return static_cast<int>(2 * i + 1);
  }
  for (std::size_t i = 0; i < rlserve_fuzz::k_part_names.size(); ++i)
    if (rlserve_fuzz::k_part_names[i] == name)
      return static_cast<int>(2 * codecs.size() + i);
  return -1;
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

template <class T>
bool write_seeds(const fs::path& dir, std::string_view name) {
  const int selector = selector_of(name);
  if (selector < 0) {
    std::fprintf(stderr, "no decoder selects %s\n", std::string(name).c_str());
    return false;
  }
  int n = 0;
  for (const auto& sample : rlserve_test::samples<T>::json()) {
    std::string text(1, static_cast<char>(selector));
    text += to_json(sample).dump();
    write_file(dir / (std::string(name) + "-" + std::to_string(n++)), text);
  }
  return true;
}

// Types with a CAF type ID (every routed request and reply).
template <class... Ts>
bool write_all(const fs::path& dir) {
  return (write_seeds<Ts>(dir, short_name<Ts>()) && ...);
}

bool json_codec_seeds(const fs::path& dir) {
  // The parts, named as in k_part_names (some have no type ID).
  bool ok = write_seeds<SamplingParams>(dir, "SamplingParams") &&
            write_seeds<FinishReason>(dir, "FinishReason") &&
            write_seeds<TopLogprob>(dir, "TopLogprob") && write_seeds<HostTensor>(dir, "HostTensor") &&
            write_seeds<NamedTensor>(dir, "NamedTensor") &&
            write_seeds<DeviceTensorRef>(dir, "DeviceTensorRef") &&
            write_seeds<NamedDeviceTensor>(dir, "NamedDeviceTensor") &&
            write_seeds<ParallelismInfo>(dir, "ParallelismInfo") &&
            write_seeds<ChecksumInfo>(dir, "ChecksumInfo");
  // Generate is written out (as everywhere it appears); every other request and reply comes from
  // the table of operations, so a new operation gets seeds without an edit here (and this file
  // does not build until tests/messages/message_samples.hpp has samples of its structs).
#define RLSERVE_OPERATION_STRUCTS(route, method, In, Out, auth, role) In, Out
  return write_all<GenerateReqInput, GenerateReqOutput,
                   RLSERVE_CONTROL_OPERATIONS(RLSERVE_OPERATION_STRUCTS, RLSERVE_OP_COMMA),
                   RLSERVE_WEIGHT_OPERATIONS(RLSERVE_OPERATION_STRUCTS, RLSERVE_OP_COMMA)>(dir) &&
         ok;
#undef RLSERVE_OPERATION_STRUCTS
}

bool config_seeds(const fs::path& dir) {
  for (auto arch : {"qwen3", "qwen3-moe"}) {
    auto c = model::preset_config(arch, "tiny");
    if (!c) {
      std::fprintf(stderr, "%s\n", c.error().c_str());
      return false;
    }
    write_file(dir / (std::string(arch) + "-tiny.json"), model::to_json(*c).dump(2));
  }
  // A Hugging Face Qwen3 config (abridged) with an INT4 compressed-tensors quantization_config.
  write_file(dir / "qwen3-int4.json", R"({"architectures": ["Qwen3ForCausalLM"],
 "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
 "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
 "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
 "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
 "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 151936,
 "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
  "quantization_status": "compressed", "config_groups": {"group_0": {"targets": ["Linear"],
  "input_activations": null, "output_activations": null, "weights": {"num_bits": 4, "type": "int",
  "strategy": "group", "group_size": 64, "symmetric": false, "actorder": null, "dynamic": false,
  "observer": "minmax"}}}, "ignore": ["lm_head", "re:.*mlp\\.gate$"], "kv_cache_scheme": null}}
)");
  return true;
}

bool tokenizer_seeds(const fs::path& dir) {
  auto text = model::tiny_tokenizer_json(model::k_tiny_tokenizer_min_vocab + 4);
  if (!text) {
    std::fprintf(stderr, "%s\n", text.error().c_str());
    return false;
  }
  write_file(dir / "tiny-tokenizer.json", *text);
  return true;
}

std::vector<NamedTensor> sample_tensors() {
  std::vector<NamedTensor> out;
  out.push_back({"model.embed_tokens.weight",
                 rlserve_test::host_tensor(dtype::bf16, {2, 3}, 1)});
  out.push_back({"model.norm.weight", rlserve_test::host_tensor(dtype::f32, {4}, 2)});
  out.push_back({"model.empty", rlserve_test::host_tensor(dtype::i32, {0, 5}, 3)});
  out.push_back({"model.scalar", rlserve_test::host_tensor(dtype::i64, {}, 4)});
  return out;
}

bool safetensors_seeds(const fs::path& dir) {
  auto tensors = sample_tensors();
  auto one = model::write_safetensors(dir / "four-tensors", tensors, {{"format", "pt"}});
  auto two = model::write_safetensors(dir / "one-tensor", std::span<const NamedTensor>(tensors).first(1));
  auto three = model::write_safetensors(dir / "empty", std::span<const NamedTensor>());
  for (const auto* s : {&one, &two, &three})
    if (!*s) {
      std::fprintf(stderr, "%s\n", s->error().c_str());
      return false;
    }
  return true;
}

bool protocol_seeds(const fs::path& dir) {
  using nlohmann::json;
  const std::vector<std::string> text_frames = {
    R"({"id": 1, "type": "generate", "body": {"text": "Hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0.7}}})",
    R"({"id": "a", "type": "begin_weight_update", "body": {"weight_version": "v2"}})",
    R"({"id": 3, "type": "health"})",
    R"({"id": 4, "type": "flush_cache", "body": null})",
  };
  int n = 0;
  for (const auto& f : text_frames)
    write_file(dir / ("text-" + std::to_string(n++)), std::string(1, '\0') + f);
  auto tensors = sample_tensors();
  auto frame = net::make_binary_frame(7, "update_weights_from_tensor",
                                      json{{"weight_version", "v2"}, {"flush_cache", false}},
                                      tensors);
  std::string bytes(1, '\1');
  bytes.append(reinterpret_cast<const char*>(frame.data()), frame.size());
  write_file(dir / "binary-0", bytes);
  auto empty = net::make_binary_frame("b", "update_weights_from_tensor", json::object(), {});
  bytes.assign(1, '\1');
  bytes.append(reinterpret_cast<const char*>(empty.data()), empty.size());
  write_file(dir / "binary-1", bytes);
  return true;
}

bool http_seeds(const fs::path& dir) {
  const std::map<std::string, std::string> requests = {
    {"generate", "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Authorization: Bearer key\r\nContent-Length: 58\r\n\r\n"
                 R"({"text": "Hi", "sampling_params": {"max_new_tokens": 4}})" "\r\n"},
    {"health", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"},
    {"generate_batch", "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 96\r\n\r\n"
                       R"({"input_ids": [[1, 2], [3]], "rid": ["a", "b"], "sampling_params": {"n": 2, "sampling_seed": 4}})"},
    {"start_profile", "POST /start_profile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: 80\r\n\r\n"
                      R"({"output_dir": "/tmp", "num_steps": 2, "activities": ["CPU"], "profile_id": "p"})"},
    {"flush", "GET /flush_cache?timeout=5&x=%41+b HTTP/1.1\r\nX-API-Key: admin\r\n\r\n"},
    {"weights", "POST /get_weights_by_name/?name=model.norm.weight&truncate_size=3 HTTP/1.1\r\n"
                "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"},
    {"upgrade", "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"},
  };
  for (const auto& [name, text] : requests)
    write_file(dir / name, text);
  return true;
}

bool torch_pickle_seeds(const fs::path& dir) {
  const fs::path fixtures = dir / ".." / ".." / ".." / "tests" / "data" / "torch_ipc";
  if (!fs::is_directory(fixtures)) {
    std::fprintf(stderr, "%s: not found (run from the repository root with fuzz/corpus)\n",
                 fixtures.string().c_str());
    return false;
  }
  for (const auto& entry : fs::directory_iterator(fixtures)) {
    const auto name = entry.path().filename().string();
    // plain_many (68 KB, 300 tensors) adds size, not new paths.
    if (entry.path().extension() != ".pkl" || name == "plain_many.pkl")
      continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const char form = name.find("bucket") != std::string::npos ? '\1' : '\0';
    write_file(dir / name, std::string(1, form) + bytes);
  }
  return true;
}

// OpenAI request bodies: the first byte picks the completion (0) or the chat (1) reader.
bool openai_seeds(const fs::path& dir) {
  write_file(dir / "completion_text",
             std::string(1, '\0') + R"({"prompt": "Hello", "max_tokens": 4, "logprobs": 2, "stop": ["\n"], "seed": 3})");
  write_file(dir / "completion_ids", std::string(1, '\0') + R"({"prompt": [[1, 2, 3]], "stream": true, )"
                                                            R"("stream_options": {"include_usage": true}, "echo": true})");
  write_file(dir / "chat",
             std::string(1, '\1') +
               R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", )"
               R"("text": "Q"}]}, {"role": "assistant", "content": "<think>r</think>A", "tool_calls": [{"function": )"
               R"({"name": "f", "arguments": {"a": 1}}}]}, {"role": "tool", "content": "x"}], "chat_template_kwargs": )"
               R"({"enable_thinking": false}, "logprobs": true, "top_logprobs": 2})");
  // miles' session server: the prompt as token ids, SGLang's per-choice extensions.
  write_file(dir / "chat_input_ids",
             std::string(1, '\1') +
               R"({"messages": [{"role": "user", "content": "Q"}], "input_ids": [1, 2, 3], "logprobs": true, )"
               R"("return_meta_info": true, "return_token_ids": true, "return_prompt_token_ids": true, )"
               R"("return_routed_experts": true, "routed_experts_start_len": 1, "no_stop_trim": false})");
  return true;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_fuzz_seeds <corpus root, e.g. fuzz/corpus>\n");
    return 2;
  }
  const fs::path root = argv[1];
  const std::pair<const char*, bool (*)(const fs::path&)> writers[] = {
    {"json_codec_fuzz", &json_codec_seeds}, {"config_fuzz", &config_seeds},
    {"tokenizer_fuzz", &tokenizer_seeds},   {"safetensors_fuzz", &safetensors_seeds},
    {"protocol_fuzz", &protocol_seeds},     {"http_fuzz", &http_seeds},
    {"torch_pickle_fuzz", &torch_pickle_seeds}, {"openai_fuzz", &openai_seeds},
  };
  bool ok = true;
  for (const auto& [target, write] : writers) {
    fs::create_directories(root / target);
    ok = write(root / target) && ok;
  }
  return ok ? 0 : 1;
}
