#include "messages/generate_fanout.hpp"

#include <algorithm>
#include <string>

namespace rlserve {

namespace {

using json = nlohmann::json;

// The fields a batch may give per prompt.
constexpr const char* k_per_prompt[] = {"sampling_params", "return_logprob", "logprob_start_len",
                                        "top_logprobs_num", "return_text_in_logprobs",
                                        "return_routed_experts"};

// n of one sampling_params value (absent or null: 1).
expected<int64_t> samples_of(const json& params, const std::string& where) {
  if (params.is_null() || !params.is_object())
    return int64_t{1};
  auto it = params.find("n");
  if (it == params.end() || it->is_null())
    return int64_t{1};
  if (!it->is_number_integer() || it->get<int64_t>() < 1)
    return fail(where + ".n: " + it->dump() + " is not a sample count (an integer >= 1)");
  return it->get<int64_t>();
}

} // namespace

expected<generate_fanout> expand_generate_request(const json& body) {
  generate_fanout out;
  if (!body.is_object())
    return fail("the request body is not a JSON object");
  // The batch: a list of texts, or a list of lists of ids.
  std::size_t batch = 1;
  bool is_batch = false;
  if (auto t = body.find("text"); t != body.end() && t->is_array()) {
    is_batch = true;
    batch = t->size();
  } else if (auto ids = body.find("input_ids");
             ids != body.end() && ids->is_array() && !ids->empty() && ids->front().is_array()) {
    is_batch = true;
    batch = ids->size();
  }
  if (is_batch && batch == 0)
    return fail("text: an empty list of prompts");
  // n: the same for every prompt.
  int64_t n = 1;
  if (auto sp = body.find("sampling_params"); sp != body.end()) {
    if (sp->is_array()) {
      if (!is_batch)
        return fail("sampling_params: a list is for a batch of prompts; this request has one");
      if (sp->size() != batch)
        return fail("sampling_params: " + std::to_string(sp->size()) + " entries for " +
                    std::to_string(batch) + " prompts");
      for (std::size_t b = 0; b < sp->size(); ++b) {
        auto nb = samples_of((*sp)[b], "sampling_params[" + std::to_string(b) + "]");
        if (!nb)
          return std::move(nb).take_failure();
        if (b == 0)
          n = *nb;
        else if (*nb != n)
          return fail("sampling_params[" + std::to_string(b) + "].n: " + std::to_string(*nb) +
                      " differs from the first prompt's " + std::to_string(n) +
                      " (every prompt takes the same number of samples)");
      }
    } else {
      auto n0 = samples_of(*sp, "sampling_params");
      if (!n0)
        return std::move(n0).take_failure();
      n = *n0;
    }
  }
  if (!is_batch && n == 1)
    return out; // a single request: read as it is
  const auto total = static_cast<std::size_t>(n) * batch;
  if (static_cast<std::size_t>(n) > k_max_fanout || total > k_max_fanout)
    return fail("this request asks for " + std::to_string(n) + " samples of " +
                std::to_string(batch) + " prompts; at most " + std::to_string(k_max_fanout) +
                " results per request (send several requests)");
  out.single = false;
  // Per-prompt list fields must match the batch; with n > 1 only rid and sampling_params may
  // be lists.
  for (const char* key : k_per_prompt) {
    auto it = body.find(key);
    if (it == body.end() || !it->is_array())
      continue;
    if (!is_batch)
      return fail(std::string(key) + ": a list is for a batch of prompts; this request has one");
    if (it->size() != batch)
      return fail(std::string(key) + ": " + std::to_string(it->size()) + " entries for " +
                  std::to_string(batch) + " prompts");
    if (n > 1 && std::string_view(key) != "sampling_params")
      return fail(std::string(key) + ": a list cannot be combined with sampling_params.n > 1 "
                                     "(give one value for every prompt)");
  }
  const json* rid = nullptr;
  if (auto it = body.find("rid"); it != body.end() && !it->is_null()) {
    rid = &*it;
    if (rid->is_array()) {
      if (!is_batch)
        return fail("rid: a list is for a batch of prompts; this request has one");
      if (rid->size() != batch)
        return fail("rid: " + std::to_string(rid->size()) + " entries for " +
                    std::to_string(batch) + " prompts");
      for (std::size_t b = 0; b < batch; ++b)
        if (!(*rid)[b].is_string() || (*rid)[b].get_ref<const std::string&>().empty())
          return fail("rid[" + std::to_string(b) + "]: " + (*rid)[b].dump() +
                      " is not a non-empty string");
    } else if (!rid->is_string() || rid->get_ref<const std::string&>().empty()) {
      return fail("rid: " + rid->dump() + " is not a non-empty string");
    }
  }
  out.requests.reserve(total);
  for (std::size_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < n; ++s) {
      const std::size_t j = b * static_cast<std::size_t>(n) + static_cast<std::size_t>(s);
      json one = json::object();
      for (auto it = body.begin(); it != body.end(); ++it) {
        const auto& key = it.key();
        if (key == "rid")
          continue;
        if (is_batch && (key == "text" || key == "input_ids") && it->is_array()) {
          one[key] = (*it)[b];
          continue;
        }
        bool per_prompt = false;
        for (const char* k : k_per_prompt)
          per_prompt = per_prompt || key == k;
        one[key] = (per_prompt && it->is_array()) ? (*it)[b] : *it;
      }
      if (rid && rid->is_string())
        one["rid"] = fanout_rid(rid->get_ref<const std::string&>(), j);
      else if (rid)
        one["rid"] = n == 1 ? (*rid)[b].get<std::string>()
                            : fanout_rid((*rid)[b].get_ref<const std::string&>(),
                                         static_cast<std::size_t>(s));
      if (n > 1) {
        auto& sp = one["sampling_params"];
        if (sp.is_null())
          sp = json::object();
        if (sp.is_object()) {
          sp.erase("n");
          // Anything but a seed (a negative number, a string) is left for the reader to refuse.
          if (auto seed = sp.find("sampling_seed");
              seed != sp.end() && (seed->is_number_unsigned() ||
                                   (seed->is_number_integer() && seed->get<int64_t>() >= 0)))
            *seed = sample_seed(seed->get<uint64_t>(), static_cast<std::size_t>(s));
        }
      }
      out.requests.push_back(std::move(one));
    }
  // Equal rids would make the engine refuse the later ones mid-batch: say so before any runs.
  if (rid && rid->is_array()) {
    std::vector<std::string> seen;
    for (const auto& r : out.requests)
      seen.push_back(r["rid"].get<std::string>());
    std::sort(seen.begin(), seen.end());
    if (auto dup = std::adjacent_find(seen.begin(), seen.end()); dup != seen.end())
      return fail("rid: \"" + *dup + "\" is given to more than one request of the batch");
  }
  return out;
}

std::string fanout_rid(std::string_view rid, std::size_t k) {
  return std::string(rid) + "_" + std::to_string(k);
}

uint64_t sample_seed(uint64_t seed, std::size_t s) { return seed + static_cast<uint64_t>(s); }

} // namespace rlserve
