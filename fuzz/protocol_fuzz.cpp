// The websocket protocol's frame readers (net/protocol.hpp) on untrusted bytes, as
// ws_connection_actor calls them. First byte even: the rest is a text frame (parse_json,
// read_envelope, then the route's request decoder). Odd: the rest is a binary tensor frame
// (read_binary_frame); every tensor's bytes are read, so one that points outside the frame is an
// ASan report, and the tensors must survive make_binary_frame -> read_binary_frame unchanged.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "caf/message.hpp"
#include "fuzz/fuzz_support.hpp"
#include "messages/codec_registry.hpp"
#include "messages/json_codec.hpp"
#include "net/protocol.hpp"

namespace {

using namespace rlserve;
using namespace rlserve::net;
using rlserve_fuzz::broken;

void text_frame(const uint8_t* data, std::size_t size) {
  auto j = parse_json(rlserve_fuzz::as_text(data, size));
  if (!j)
    return;
  json id;
  auto env = read_envelope(*j, id);
  if (!env) {
    (void)error_text(id, "", error_code::bad_request, env.error());
    return;
  }
  if (const codec_entry* c = find_codec(env->type))
    (void)c->decode(env->body);
}

shared_bytes frame_of(const void* data, std::size_t size) {
  // Its own allocation of exactly `size` bytes, so ASan sees a read past the frame.
  std::shared_ptr<std::byte[]> bytes(new std::byte[size]);
  if (size)
    std::memcpy(bytes.get(), data, size);
  return {std::shared_ptr<const std::byte>(bytes, bytes.get()), size};
}

unsigned touch(const HostTensor& t) {
  unsigned sum = 0;
  for (auto b : t.bytes())
    sum += static_cast<unsigned>(b);
  return sum;
}

void binary_frame(const uint8_t* data, std::size_t size) {
  auto frame = frame_of(data, size);
  json id;
  auto req = read_binary_frame(frame, id);
  if (!req)
    return;
  volatile unsigned sink = 0;
  for (const auto& t : req->tensors)
    sink = sink + touch(t.tensor);

  auto rebuilt = make_binary_frame(req->envelope.id, req->envelope.type, req->envelope.body,
                                   req->tensors);
  json id2;
  auto again = read_binary_frame(frame_of(rebuilt.data(), rebuilt.size()), id2);
  if (!again)
    broken("make_binary_frame wrote a frame that read_binary_frame refuses: " + again.error());
  if (again->tensors.size() != req->tensors.size() || again->envelope.type != req->envelope.type ||
      dump(again->envelope.body) != dump(req->envelope.body) ||
      dump(again->envelope.id) != dump(req->envelope.id))
    broken("the envelope or the tensor count changed on the round trip");
  for (std::size_t i = 0; i < req->tensors.size(); ++i) {
    const auto& a = req->tensors[i];
    const auto& b = again->tensors[i];
    if (a.name != b.name || a.tensor.type != b.tensor.type || a.tensor.shape != b.tensor.shape ||
        a.tensor.nbytes != b.tensor.nbytes ||
        (a.tensor.nbytes && std::memcmp(a.tensor.data.get(), b.tensor.data.get(), a.tensor.nbytes)))
      broken("tensor " + a.name + " changed on the round trip");
  }
  // Rebuilt frames are aligned: every tensor aliases the frame.
  if (again->copied_tensors != 0)
    broken("make_binary_frame placed a tensor at a misaligned offset");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1)
    return 0;
  if (data[0] % 2 == 0)
    text_frame(data + 1, size - 1);
  else
    binary_frame(data + 1, size - 1);
  return 0;
}
