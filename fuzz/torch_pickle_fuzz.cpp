// messages/torch_pickle.hpp's restricted pickle machine on untrusted bytes (a trainer's
// serialized_named_tensors, after base64). First byte even: the list form, odd: the flattened
// bucket form; the rest is the pickle. Whatever it accepts must be a tensor the JSON contract
// can carry: to_json -> from_json<NamedDeviceTensor> accepts it.
#include <cstddef>
#include <cstdint>
#include <span>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.hpp"
#include "messages/json_codec.hpp"
#include "messages/torch_pickle.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace rlserve;
  if (size < 1)
    return 0;
  const auto form = data[0] % 2 == 0 ? torch_pickle_form::named_list
                                     : torch_pickle_form::flattened_bucket;
  std::span<const std::byte> pickle(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  auto tensors = read_torch_ipc_pickle(pickle, form);
  if (!tensors)
    return 0;
  for (const auto& t : *tensors) {
    auto back = from_json<NamedDeviceTensor>(to_json(t));
    if (!back)
      rlserve_fuzz::broken("a tensor read from a pickle does not survive its JSON form: " +
                           back.error());
  }
  return 0;
}
