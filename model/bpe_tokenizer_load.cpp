// Reading tokenizer.json into a bpe_tokenizer's state: every field `tokenizers` would use is
// either loaded or refused with the JSON path that holds it. See bpe_tokenizer.hpp for the
// pipeline the loaded state drives.
#include <fstream>
#include <memory>
#include <stdexcept>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/bpe_tokenizer_state.hpp"

namespace rlserve::model {

using json = nlohmann::json;
using namespace bpe_internal;

namespace {

// ---- load errors ----------------------------------------------------------------------------

// Thrown only inside the loader and turned into a failure by from_json; never escapes the API.
struct load_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void reject(const std::string& path, const std::string& what) {
  throw load_error(fmt::format("{}: {}", path.empty() ? std::string("(root)") : path, what));
}

std::string json_quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string type_name(const json& j) { return j.type_name(); }

const json* member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

bool is_null_or_missing(const json* j) { return j == nullptr || j->is_null(); }

bool get_bool(const json& obj, const char* key, const std::string& path, bool fallback) {
  const json* v = member(obj, key);
  if (is_null_or_missing(v))
    return fallback;
  if (!v->is_boolean())
    reject(path + "." + key, "expected true or false, found " + type_name(*v));
  return v->get<bool>();
}

std::string get_string(const json& obj, const char* key, const std::string& path) {
  const json* v = member(obj, key);
  if (v == nullptr)
    reject(path + "." + key, "missing");
  if (!v->is_string())
    reject(path + "." + key, "expected a string, found " + type_name(*v));
  return v->get<std::string>();
}

const json& get_object(const json& obj, const char* key, const std::string& path) {
  const json* v = member(obj, key);
  if (v == nullptr)
    reject(path.empty() ? key : path + "." + key, "missing");
  if (!v->is_object())
    reject(path.empty() ? key : path + "." + key, "expected an object, found " + type_name(*v));
  return *v;
}

} // namespace

// ---- loading --------------------------------------------------------------------------------

namespace {

using state_ptr = std::shared_ptr<bpe_tokenizer::state>;

void load_normalizer(const json& j, const std::string& path, bpe_tokenizer::state& st) {
  if (j.is_null())
    return;
  if (!j.is_object())
    reject(path, "expected an object or null, found " + type_name(j));
  const std::string type = get_string(j, "type", path);
  if (type == "NFC") {
    st.nfc = true;
  } else if (type == "Sequence") {
    const json* list = member(j, "normalizers");
    if (list == nullptr || !list->is_array())
      reject(path + ".normalizers", "expected an array");
    for (std::size_t i = 0; i < list->size(); ++i)
      load_normalizer((*list)[i], fmt::format("{}.normalizers[{}]", path, i), st);
  } else {
    reject(path + ".type", json_quote(type) +
                             " is not supported (byte-level BPE here supports no normalizer or NFC)");
  }
}

void load_pre_tokenizer(const json& j, const std::string& path, bpe_tokenizer::state& st,
                        int& byte_level_steps, bool& byte_level_last) {
  if (!j.is_object())
    reject(path, "expected an object, found " + type_name(j));
  const std::string type = get_string(j, "type", path);
  if (type == "Sequence") {
    const json* list = member(j, "pretokenizers");
    if (list == nullptr || !list->is_array())
      reject(path + ".pretokenizers", "expected an array");
    for (std::size_t i = 0; i < list->size(); ++i)
      load_pre_tokenizer((*list)[i], fmt::format("{}.pretokenizers[{}]", path, i), st,
                         byte_level_steps, byte_level_last);
    return;
  }
  if (byte_level_steps > 0)
    byte_level_last = false;
  if (type == "Split") {
    const json& pat = get_object(j, "pattern", path);
    const json* rx = member(pat, "Regex");
    const json* lit = member(pat, "String");
    if ((rx == nullptr) == (lit == nullptr))
      reject(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    const json& p = rx ? *rx : *lit;
    const std::string ppath = path + ".pattern." + (rx ? "Regex" : "String");
    if (!p.is_string())
      reject(ppath, "expected a string, found " + type_name(p));
    const std::string pattern = p.get<std::string>();
    auto re = bpe_detail::regex::compile(pattern, lit != nullptr);
    if (!re)
      reject(ppath, re.error());
    split_step step{std::move(*re)};
    const std::string behavior = get_string(j, "behavior", path);
    if (behavior == "Removed")
      step.behavior = split_behavior::removed;
    else if (behavior == "Isolated")
      step.behavior = split_behavior::isolated;
    else if (behavior == "MergedWithPrevious")
      step.behavior = split_behavior::merged_with_previous;
    else if (behavior == "MergedWithNext")
      step.behavior = split_behavior::merged_with_next;
    else if (behavior == "Contiguous")
      step.behavior = split_behavior::contiguous;
    else
      reject(path + ".behavior", json_quote(behavior) + " is not a split behavior (Removed, Isolated, "
                                                    "MergedWithPrevious, MergedWithNext, Contiguous)");
    const json* inv = member(j, "invert");
    if (inv == nullptr || !inv->is_boolean())
      reject(path + ".invert", "expected true or false");
    step.invert = inv->get<bool>();
    st.splits.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    ++byte_level_steps;
    byte_level_last = true;
    // Defaults are those of ByteLevel::default() in `tokenizers`.
    st.add_prefix_space = get_bool(j, "add_prefix_space", path, true);
    if (get_bool(j, "use_regex", path, true)) {
      auto re = bpe_detail::regex::compile(bpe_detail::gpt2_pattern);
      if (!re)
        reject(path, "GPT-2 regex: " + re.error());
      st.byte_level_regex = std::move(*re);
    }
  } else {
    reject(path + ".type", json_quote(type) + " is not supported (byte-level BPE here supports "
                                          "Sequence, Split and ByteLevel)");
  }
}

// Post-processors only change ids when they add special tokens around the text.
void load_post_processor(const json& j, const std::string& path) {
  if (j.is_null())
    return;
  if (!j.is_object())
    reject(path, "expected an object or null, found " + type_name(j));
  const std::string type = get_string(j, "type", path);
  if (type == "ByteLevel")
    return; // trims offsets only
  if (type == "Sequence") {
    const json* list = member(j, "processors");
    if (list == nullptr || !list->is_array())
      reject(path + ".processors", "expected an array");
    for (std::size_t i = 0; i < list->size(); ++i)
      load_post_processor((*list)[i], fmt::format("{}.processors[{}]", path, i));
    return;
  }
  if (type == "TemplateProcessing") {
    // Accepted only when the single-sequence template is the text alone ("$A").
    const json* single = member(j, "single");
    if (single && single->is_array() && single->size() == 1 && (*single)[0].contains("Sequence"))
      return;
  }
  reject(path + ".type", json_quote(type) + " adds tokens around the text; not supported (encode() "
                                        "returns the text's tokens only)");
}

void load_decoder(const json& j, const std::string& path) {
  if (!j.is_object())
    reject(path, "expected a ByteLevel decoder, found " + type_name(j));
  const std::string type = get_string(j, "type", path);
  if (type == "ByteLevel")
    return;
  if (type == "Sequence") {
    const json* list = member(j, "decoders");
    if (list == nullptr || !list->is_array() || list->empty())
      reject(path + ".decoders", "expected a non-empty array");
    for (std::size_t i = 0; i < list->size(); ++i)
      load_decoder((*list)[i], fmt::format("{}.decoders[{}]", path, i));
    return;
  }
  reject(path + ".type", json_quote(type) + " is not supported (byte-level BPE decodes with ByteLevel)");
}

void load_model(const json& root, bpe_tokenizer::state& st) {
  const json& m = get_object(root, "model", "");
  const std::string type = get_string(m, "type", "model");
  if (type != "BPE")
    reject("model.type", json_quote(type) + " is not supported (only BPE)");
  if (const json* d = member(m, "dropout"); !is_null_or_missing(d)) {
    if (!d->is_number())
      reject("model.dropout", "expected a number or null");
    if (d->get<double>() != 0.0)
      reject("model.dropout", "BPE dropout makes tokenization random; not supported for serving");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = member(m, key);
    if (is_null_or_missing(v))
      continue;
    if (!v->is_string())
      reject(std::string("model.") + key, "expected a string or null");
    if (!v->get<std::string>().empty())
      reject(std::string("model.") + key, "word-piece style affixes are not supported by "
                                          "byte-level BPE here (must be null or \"\")");
  }
  st.fuse_unk = get_bool(m, "fuse_unk", "model", false);
  st.byte_fallback = get_bool(m, "byte_fallback", "model", false);
  st.ignore_merges = get_bool(m, "ignore_merges", "model", false);

  const json& vocab = get_object(m, "vocab", "model");
  st.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string path = "model.vocab[" + json_quote(it.key()) + "]";
    if (!it->is_number_integer())
      reject(path, "expected an integer id, found " + type_name(*it));
    const int64_t id = it->get<int64_t>();
    if (id < 0 || id > k_max_id)
      reject(path, fmt::format("id {} is outside [0, {}]", id, k_max_id));
    st.vocab.emplace(it.key(), int32_t(id));
  }

  if (const json* unk = member(m, "unk_token"); !is_null_or_missing(unk)) {
    if (!unk->is_string())
      reject("model.unk_token", "expected a string or null");
    auto it = st.vocab.find(unk->get<std::string>());
    if (it == st.vocab.end())
      reject("model.unk_token", json_quote(unk->get<std::string>()) + " is not in model.vocab");
    st.unk_id = it->second;
  }

  const json* merges = member(m, "merges");
  if (merges == nullptr)
    reject("model.merges", "missing");
  if (!merges->is_array())
    reject("model.merges", "expected an array, found " + type_name(*merges));
  st.merges.reserve(merges->size() * 2);
  uint32_t rank = 0;
  for (std::size_t i = 0; i < merges->size(); ++i) {
    const json& e = (*merges)[i];
    const std::string path = fmt::format("model.merges[{}]", i);
    std::string a, b;
    if (e.is_string()) {
      // The older "a b" form: exactly one space, as convert_merges_to_hashmap requires.
      const std::string s = e.get<std::string>();
      if (s.rfind("#version", 0) == 0)
        continue; // a merges.txt header kept in the list is skipped and takes no rank
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        reject(path, json_quote(s) + " is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      reject(path, "expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = st.vocab.find(a), ib = st.vocab.find(b), iab = st.vocab.find(a + b);
    if (ia == st.vocab.end())
      reject(path, json_quote(a) + " is not in model.vocab");
    if (ib == st.vocab.end())
      reject(path, json_quote(b) + " is not in model.vocab");
    if (iab == st.vocab.end())
      reject(path, "the merged token " + json_quote(a + b) + " is not in model.vocab");
    // A pair listed twice keeps its last rank, as the HashMap collect in `tokenizers` does.
    st.merges[pair_key(ia->second, ib->second)] = {rank++, iab->second};
  }

  for (int b = 0; b < 256; ++b) {
    auto it = st.vocab.find(tables().symbol[b]);
    st.byte_id[b] = it == st.vocab.end() ? -1 : it->second;
  }
}

void load_added_tokens(const json& root, bpe_tokenizer::state& st) {
  const json* list = member(root, "added_tokens");
  if (is_null_or_missing(list))
    return;
  if (!list->is_array())
    reject("added_tokens", "expected an array, found " + type_name(*list));
  // `tokenizers` does not trust the ids written here: it gives each new content the model's id
  // if the content is a vocab entry, else the next free id after the model vocab (counted as
  // vocab entries), in file order. We require the file to agree, so ids never silently differ.
  int64_t next_id = int64_t(st.vocab.size());
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    const std::string path = fmt::format("added_tokens[{}]", i);
    if (!e.is_object())
      reject(path, "expected an object, found " + type_name(e));
    added_token t;
    t.content = get_string(e, "content", path);
    const json* id = member(e, "id");
    if (id == nullptr || !id->is_number_integer())
      reject(path + ".id", "expected an integer");
    const int64_t id_value = id->get<int64_t>();
    if (id_value < 0 || id_value > k_max_id)
      reject(path + ".id", fmt::format("{} is outside [0, {}]", id_value, k_max_id));
    t.id = int32_t(id_value);
    t.special = get_bool(e, "special", path, false);
    t.single_word = get_bool(e, "single_word", path, false);
    t.lstrip = get_bool(e, "lstrip", path, false);
    t.rstrip = get_bool(e, "rstrip", path, false);
    t.normalized = get_bool(e, "normalized", path, true);
    if (t.content.empty())
      continue; // ignored by `tokenizers` too
    if (auto it = st.added_by_content.find(t.content); it != st.added_by_content.end())
      reject(path + ".content", json_quote(t.content) + " is listed twice");
    int64_t expected_id;
    if (auto it = st.vocab.find(t.content); it != st.vocab.end())
      expected_id = it->second;
    else
      expected_id = next_id++;
    if (expected_id != t.id)
      reject(path + ".id", fmt::format("{} given, but `tokenizers` would give {} id {} (added tokens "
                                       "must be vocab entries or follow the vocab without gaps)",
                                       t.id, json_quote(t.content), expected_id));
    t.pattern = t.normalized && st.nfc ? bpe_detail::nfc(t.content) : t.content;
    st.added_by_content.emplace(t.content, t.id);
    st.added.push_back(std::move(t));
  }
}

void build_id_tables(bpe_tokenizer::state& st) {
  int64_t max_id = -1;
  for (const auto& [s, id] : st.vocab)
    max_id = std::max<int64_t>(max_id, id);
  for (const auto& t : st.added)
    max_id = std::max<int64_t>(max_id, t.id);
  st.vocab_size = int32_t(max_id + 1);

  std::vector<std::string_view> texts(st.vocab_size);
  st.flags.assign(st.vocab_size, 0);
  for (const auto& [s, id] : st.vocab) {
    if (st.flags[id] & bpe_tokenizer::state::k_present)
      reject(fmt::format("model.vocab[{}]", json_quote(s)),
             fmt::format("id {} is also used by {}", id, json_quote(texts[id])));
    st.flags[id] = bpe_tokenizer::state::k_present;
    texts[id] = s;
  }
  for (const auto& t : st.added) {
    // An added token that is not a vocab entry must not take a vocab entry's id.
    if ((st.flags[t.id] & bpe_tokenizer::state::k_present) && texts[t.id] != t.content)
      reject(fmt::format("added_tokens[id {}]", t.id),
             fmt::format("{} takes the id of model.vocab's {}", json_quote(t.content),
                         json_quote(texts[t.id])));
    st.flags[t.id] |= bpe_tokenizer::state::k_present | bpe_tokenizer::state::k_added |
                      (t.special ? bpe_tokenizer::state::k_special : 0);
    texts[t.id] = t.content;
  }

  st.text_off.assign(st.vocab_size + 1, 0);
  st.bytes_off.assign(st.vocab_size + 1, 0);
  std::unordered_map<int32_t, const added_token*> added_by_id;
  for (const auto& t : st.added)
    added_by_id[t.id] = &t;
  for (int32_t id = 0; id < st.vocab_size; ++id) {
    st.text_off[id] = uint32_t(st.text_blob.size());
    st.bytes_off[id] = uint32_t(st.bytes_blob.size());
    if (!(st.flags[id] & bpe_tokenizer::state::k_present))
      continue;
    st.text_blob += texts[id];
    // What the ByteLevel decoder turns the token into: its symbols mapped back to bytes, or the
    // token's own UTF-8 when some character is not a byte symbol. Added tokens are decoded from
    // their normalized form, as AddedVocabulary::simple_id_to_token hands it to the decoder.
    std::string_view source = texts[id];
    if (auto it = added_by_id.find(id); it != added_by_id.end() && it->second->normalized && st.nfc)
      source = it->second->pattern;
    if (auto bytes = bpe_detail::symbols_to_bytes(source))
      st.bytes_blob += *bytes;
    else
      st.bytes_blob += source;
  }
  st.text_off[st.vocab_size] = uint32_t(st.text_blob.size());
  st.bytes_off[st.vocab_size] = uint32_t(st.bytes_blob.size());
}

state_ptr load_state(const json& root) {
  if (!root.is_object())
    reject("", "expected a tokenizer.json object, found " + type_name(root));
  auto st = std::make_shared<bpe_tokenizer::state>();
  if (const json* v = member(root, "version"); !is_null_or_missing(v)) {
    if (!v->is_string() || v->get<std::string>() != "1.0")
      reject("version", v->dump() + " is not supported (expected \"1.0\")");
  }
  for (const char* key : {"truncation", "padding"})
    if (!is_null_or_missing(member(root, key)))
      reject(key, "must be null: truncation and padding change what encode() returns");

  load_model(root, *st);
  if (const json* n = member(root, "normalizer"); n != nullptr)
    load_normalizer(*n, "normalizer", *st);

  const json* pre = member(root, "pre_tokenizer");
  if (is_null_or_missing(pre))
    reject("pre_tokenizer", "missing; byte-level BPE needs a ByteLevel pre-tokenizer");
  int byte_level_steps = 0;
  bool byte_level_last = false;
  load_pre_tokenizer(*pre, "pre_tokenizer", *st, byte_level_steps, byte_level_last);
  if (byte_level_steps != 1 || !byte_level_last)
    reject("pre_tokenizer", "must end with exactly one ByteLevel step (after any Split steps)");

  if (const json* pp = member(root, "post_processor"); pp != nullptr)
    load_post_processor(*pp, "post_processor");
  const json* dec = member(root, "decoder");
  if (is_null_or_missing(dec))
    reject("decoder", "missing; byte-level BPE needs a ByteLevel decoder");
  load_decoder(*dec, "decoder");

  load_added_tokens(root, *st);
  build_id_tables(*st);
  st->raw_matcher.build(st->added, false);
  st->normalized_matcher.build(st->added, true);
  return st;
}

} // namespace

// ---- bpe_tokenizer --------------------------------------------------------------------------

expected<bpe_tokenizer> bpe_tokenizer::from_json(const nlohmann::json& tokenizer_json) {
  try {
    return bpe_tokenizer(load_state(tokenizer_json));
  } catch (const load_error& e) {
    return fail(e.what());
  } catch (const json::exception& e) {
    return fail(std::string("malformed tokenizer.json: ") + e.what());
  }
}

expected<bpe_tokenizer> bpe_tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  std::ifstream in(tokenizer_json, std::ios::binary);
  if (!in)
    return fail(tokenizer_json.string() + ": cannot open");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    return fail(tokenizer_json.string() + ": not valid JSON: " + e.what());
  }
  auto tok = from_json(j);
  if (!tok)
    return fail(tokenizer_json.string() + ": " + tok.error());
  return tok;
}

} // namespace rlserve::model
