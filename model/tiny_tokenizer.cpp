// Deterministic byte-level BPE training on a built-in corpus, and the Qwen2-style tokenizer.json
// around it. See tiny_tokenizer.hpp for the id layout.
#include "model/tiny_tokenizer.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/bpe_tokenizer.hpp"

namespace rlserve::model {

namespace {

// Written for this project. Varied on purpose: the merges it yields should cover common English
// words, leading spaces, indentation, punctuation runs, digits and multi-byte characters, so
// that text a test or demo throws at a tiny model is tokenized into more than single bytes.
constexpr std::string_view k_corpus = R"corpus(The quick brown fox jumps over the lazy dog. The dog does not move; it is asleep in the sun.
A rollout engine generates text for a model that is being trained. Each request carries a prompt,
sampling parameters and a limit on the number of new tokens. The engine answers with the tokens,
their log-probabilities and the version of the weights that produced them.

When the trainer has new weights, it pauses generation, sends the weights, and the engine goes back
to work. Old weights keep serving until the new ones are complete and checked. This is how the
loop stays fast: nobody waits longer than they must, and nothing is lost.

"Where are you going?" she asked. "I'm going to the station. I don't think the train will wait."
"You're late again," he said. "It's the third time this week. We'll miss the start if they've left."
"I'd rather be late than wrong," she replied. "THAT'S WHAT YOU SAID LAST TIME, AND IT'S STILL TRUE."
They'll find it. He's sure. She'd known all along, and we've all heard the story before.

Questions and answers:
Q: What is 12 + 30? A: 42.
Q: How many seconds are in a day? A: 86400 seconds, or 24 * 60 * 60.
Q: What year did the project start? A: 2024, on 2024-05-17 at 09:30:00 UTC.
Prices: $3.99, $12.50, €7,25 and £1,000,000. Pi is about 3.14159265358979. Call +1 (555) 010-0199.
Versions 0.17.6, 1.74.0 and 12.4; hashes 0x1F2E3D4C, 0xdeadbeef; ports 8080 and 443.

def tokenize(text: str) -> list[int]:
    """Split text into pieces and merge the most frequent pairs."""
    ids = []
    for word in text.split():
        if not word:
            continue
        ids.extend(encode_word(word))
    return ids


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value


#include <vector>
#include <string>

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const auto& arg : args) {
    if (arg == "--help") {
      return 0;
    }
  }
  return static_cast<int>(args.size());
}

{"id": 7, "text": "hello world", "max_tokens": 128, "temperature": 0.7, "stream": true}
{"model": "qwen3", "weight_version": "step-100", "success": false, "message": "queue full"}

$ cmake --build build -j 8 && ctest --output-on-failure
$ git log --oneline | head -n 5
for i in $(seq 1 10); do echo "run $i"; done

Il était une fois un café près de la gare, où l'on servait des crêpes et du thé glacé.
Der Straßenbahnfahrer grüßte die Fahrgäste: „Schönen Tag noch!“ Die Brücke über den Fluss ist alt.
El niño comió una manzana y dijo: «¡Qué rica está!» Mañana iremos a la playa con mis amigos.
Москва — столица России. Мы говорим по-русски, и это очень интересно.
Η γλώσσα μας είναι ελληνική. Καλημέρα σε όλους!
中文文本用于测试分词器。今天天气很好，我们去公园散步吧。
日本語のテキストも少し入れます。東京は大きな都市です。
한국어 문장도 조금 있습니다. 감사합니다!
مرحبا بالعالم. هذه جملة عربية قصيرة.
Emoji: 😀 😂 🚀 👍 ❤️ 🎉 👩‍💻 🇩🇪 ✅

The weather today is mild and clear, with a light wind from the west. Tomorrow will be warmer,
and the rain should return by the end of the week. Farmers are happy; the fields need water.
Reading, writing and arithmetic are taught in every school. Students learn to think, to ask
questions, and to check their answers. Good teachers make the difference between knowing a fact
and understanding why it is true.

Tabs	and	spaces    are	different.   Trailing spaces matter too.   
Lines can end with \n or \r\n; some files mix them.
    Indented blocks use four spaces.
        Nested blocks use eight.
)corpus";

constexpr std::string_view k_special_tokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

// A chat template in Qwen3's style (ChatML turns, <think> blocks, tool calls and tool results,
// enable_thinking), so that apply_chat_template and /v1/chat/completions work on the generated
// models and exercise what Qwen3's own template needs of a Jinja implementation
// (model/jinja.hpp): namespaces, reversed slices, string methods, tests, tojson.
constexpr std::string_view k_chat_template = R"jinja({#- A Qwen3-style chat template for the test models: a system turn (with the tools when given),
    turns in ChatML, the reasoning of assistant turns after the last user query kept in <think>
    blocks (earlier ones dropped), tool calls as <tool_call> JSON, consecutive tool results in one
    user turn, and enable_thinking=false closing an empty <think> block. -#}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nThese functions may be called. Their signatures:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nTo call one, answer with <tool_call></tool_call> tags around {\"name\": <name>, \"arguments\": <arguments as a JSON object>}.<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
)jinja";

struct trained_bpe {
  std::vector<std::string> token_bytes;                  // id -> bytes (ids 0..255: the bytes)
  std::vector<std::pair<int32_t, int32_t>> merges;       // in rank order
};

// Greedy BPE training: repeatedly merge the most frequent adjacent pair over the distinct
// pre-tokens of the corpus (weighted by how often each occurs), until the vocabulary has
// `model_vocab` entries. A merge whose result already exists (the same bytes reached through a
// different split) is still recorded but adds no entry, as the `tokenizers` trainer does. When
// the corpus has no pair left, padding merges of two single bytes follow (see
// k_tiny_tokenizer_max_vocab).
trained_bpe train(int32_t model_vocab) {
  trained_bpe out;
  for (int b = 0; b < 256; ++b)
    out.token_bytes.emplace_back(1, char(b));
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b)
    id_of.emplace(out.token_bytes[b], b);

  // Pre-tokenize exactly as the written tokenizer will: NFC, then the Qwen2 regex (Isolated).
  const std::string text = bpe_detail::nfc(k_corpus);
  auto re = bpe_detail::regex::compile(bpe_detail::qwen2_pattern);
  std::map<std::string, int64_t> counts; // ordered: a deterministic word order
  std::size_t prev = 0;
  auto count = [&](std::size_t b, std::size_t e) {
    if (e > b)
      ++counts[text.substr(b, e - b)];
  };
  for (auto [b, e] : re->find_all(text)) {
    count(prev, b);
    count(b, e);
    prev = e;
  }
  count(prev, text.size());

  struct word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  std::vector<word> words;
  for (const auto& [w, c] : counts) {
    word x{{}, c};
    for (unsigned char b : w)
      x.symbols.push_back(b);
    words.push_back(std::move(x));
  }

  auto add_merge = [&](int32_t a, int32_t b) {
    std::string merged = out.token_bytes[a] + out.token_bytes[b];
    int32_t id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      id = it->second;
    } else {
      id = int32_t(out.token_bytes.size());
      out.token_bytes.push_back(merged);
      id_of.emplace(std::move(merged), id);
    }
    out.merges.emplace_back(a, b);
    return id;
  };

  while (int32_t(out.token_bytes.size()) < model_vocab) {
    std::unordered_map<uint64_t, int64_t> pair_counts;
    for (const auto& w : words)
      for (std::size_t i = 0; i + 1 < w.symbols.size(); ++i)
        pair_counts[uint64_t(uint32_t(w.symbols[i])) << 32 | uint32_t(w.symbols[i + 1])] += w.count;
    if (pair_counts.empty())
      break;
    // Highest count; ties go to the pair whose (left bytes, right bytes) sorts first.
    uint64_t best = 0;
    int64_t best_count = -1;
    for (const auto& [key, c] : pair_counts) {
      if (c < best_count)
        continue;
      if (c == best_count) {
        const auto& ka = out.token_bytes[key >> 32];
        const auto& kb = out.token_bytes[key & 0xFFFFFFFF];
        const auto& ba = out.token_bytes[best >> 32];
        const auto& bb = out.token_bytes[best & 0xFFFFFFFF];
        if (std::tie(ka, kb) >= std::tie(ba, bb))
          continue;
      }
      best = key;
      best_count = c;
    }
    const int32_t a = int32_t(best >> 32), b = int32_t(best & 0xFFFFFFFF);
    const int32_t merged = add_merge(a, b);
    for (auto& w : words) {
      auto& s = w.symbols;
      std::size_t write = 0;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          s[write++] = merged;
          ++i;
        } else {
          s[write++] = s[i];
        }
      }
      s.resize(write);
    }
  }

  for (int32_t a = 0; a < 256 && int32_t(out.token_bytes.size()) < model_vocab; ++a)
    for (int32_t b = 0; b < 256 && int32_t(out.token_bytes.size()) < model_vocab; ++b)
      if (!id_of.count(out.token_bytes[a] + out.token_bytes[b]))
        add_merge(a, b);
  return out;
}

nlohmann::ordered_json byte_level(bool use_regex = false) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
          {"use_regex", use_regex}};
}

nlohmann::ordered_json added_token_json(int32_t id, std::string_view content) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", false}, {"special", true}};
}

expected<void> check_vocab_size(int32_t vocab_size) {
  if (vocab_size < k_tiny_tokenizer_min_vocab || vocab_size > k_tiny_tokenizer_max_vocab)
    return fail(fmt::format("tiny tokenizer: vocab_size {} is outside [{}, {}] (256 bytes + at "
                            "least one learned token + 3 special tokens)",
                            vocab_size, k_tiny_tokenizer_min_vocab, k_tiny_tokenizer_max_vocab));
  return {};
}

} // namespace

std::string_view tiny_tokenizer_corpus() { return k_corpus; }

expected<std::string> tiny_tokenizer_json(int32_t vocab_size) {
  if (auto ok = check_vocab_size(vocab_size); !ok)
    return std::move(ok).take_failure();
  const int32_t model_vocab = vocab_size - int32_t(std::size(k_special_tokens));
  const trained_bpe bpe = train(model_vocab);
  if (int32_t(bpe.token_bytes.size()) != model_vocab)
    return fail(fmt::format("tiny tokenizer: could only make {} tokens, {} asked for",
                            bpe.token_bytes.size(), model_vocab));

  // Written by hand around small dump()s: nlohmann's ordered_json finds keys by linear search, so
  // building a 65k-entry vocab object with it is quadratic. One vocab entry / merge per line.
  auto q = [](std::string_view s) { return nlohmann::json(std::string(s)).dump(); };
  std::string out = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  out += "  \"added_tokens\": [\n";
  for (std::size_t i = 0; i < std::size(k_special_tokens); ++i)
    out += fmt::format("    {}{}\n", added_token_json(model_vocab + int32_t(i), k_special_tokens[i]).dump(),
                       i + 1 < std::size(k_special_tokens) ? "," : "");
  out += "  ],\n";
  const nlohmann::ordered_json normalizer = {{"type", "NFC"}};
  const nlohmann::ordered_json pre_tokenizer = {
    {"type", "Sequence"},
    {"pretokenizers",
     {{{"type", "Split"},
       {"pattern", {{"Regex", bpe_detail::qwen2_pattern}}},
       {"behavior", "Isolated"},
       {"invert", false}},
      byte_level()}}};
  out += "  \"normalizer\": " + normalizer.dump() + ",\n";
  out += "  \"pre_tokenizer\": " + pre_tokenizer.dump() + ",\n";
  out += "  \"post_processor\": " + byte_level().dump() + ",\n";
  out += "  \"decoder\": " + byte_level().dump() + ",\n";
  out += "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
         "    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n"
         "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n";
  out += "    \"vocab\": {\n";
  for (std::size_t id = 0; id < bpe.token_bytes.size(); ++id)
    out += fmt::format("      {}: {}{}\n", q(bpe_detail::bytes_to_symbols(bpe.token_bytes[id])), id,
                       id + 1 < bpe.token_bytes.size() ? "," : "");
  out += "    },\n    \"merges\": [\n";
  for (std::size_t i = 0; i < bpe.merges.size(); ++i) {
    auto [a, b] = bpe.merges[i];
    out += fmt::format("      [{}, {}]{}\n", q(bpe_detail::bytes_to_symbols(bpe.token_bytes[a])),
                       q(bpe_detail::bytes_to_symbols(bpe.token_bytes[b])),
                       i + 1 < bpe.merges.size() ? "," : "");
  }
  out += "    ]\n  }\n}\n";
  return out;
}

expected<tiny_tokenizer_info> write_tiny_tokenizer(const std::filesystem::path& dir, int32_t vocab_size) {
  auto text = tiny_tokenizer_json(vocab_size);
  if (!text)
    return std::move(text).take_failure();
  const int32_t model_vocab = vocab_size - int32_t(std::size(k_special_tokens));

  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < std::size(k_special_tokens); ++i) {
    auto t = added_token_json(model_vocab + int32_t(i), k_special_tokens[i]);
    t.erase("id");
    decoder[std::to_string(model_vocab + int32_t(i))] = std::move(t);
  }
  nlohmann::ordered_json config;
  config["add_bos_token"] = false;
  config["add_prefix_space"] = false;
  config["added_tokens_decoder"] = std::move(decoder);
  config["additional_special_tokens"] = {k_special_tokens[1], k_special_tokens[2]};
  config["bos_token"] = nullptr;
  config["chat_template"] = k_chat_template;
  config["clean_up_tokenization_spaces"] = false;
  config["eos_token"] = k_special_tokens[0];
  config["errors"] = "replace";
  config["pad_token"] = k_special_tokens[0];
  config["split_special_tokens"] = false;
  config["tokenizer_class"] = "Qwen2Tokenizer";
  config["unk_token"] = nullptr;

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return fail(fmt::format("{}: cannot create directory: {}", dir.string(), ec.message()));
  auto write = [](const std::filesystem::path& path, std::string_view body) -> expected<void> {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(body.data(), std::streamsize(body.size()));
    out.close();
    if (!out)
      return fail(path.string() + ": cannot write");
    return {};
  };
  if (auto ok = write(dir / "tokenizer.json", *text); !ok)
    return std::move(ok).take_failure();
  if (auto ok = write(dir / "tokenizer_config.json", config.dump(2) + "\n"); !ok)
    return std::move(ok).take_failure();

  tiny_tokenizer_info info{vocab_size, model_vocab, {}};
  for (auto s : k_special_tokens)
    info.special_tokens.emplace_back(s);
  return info;
}

} // namespace rlserve::model
