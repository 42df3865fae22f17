// messages/torch_pickle.hpp: the restricted reader of PyTorch's CUDA IPC pickles.
//
// Three parts: the fixtures PyTorch 2.11 wrote on an H200 (tests/data/torch_ipc/, made by
// scripts/gpu/make_ipc_fixtures.py) read back to what expected.json says; hostile streams built
// here opcode by opcode, each refused with a sentence naming what is wrong and where; and the
// JSON codec's serialized_named_tensors path over the same fixtures.
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/base64.hpp"
#include "messages/json_codec.hpp"
#include "messages/torch_pickle.hpp"

using namespace rlserve;
using nlohmann::json;

namespace {

std::filesystem::path fixture_dir() {
  if (const char* root = std::getenv("RLSERVE_SOURCE_DIR"))
    return std::filesystem::path(root) / "tests/data/torch_ipc";
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "data/torch_ipc";
}

std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  BOOST_TEST_REQUIRE(in.good(), "cannot open " << p);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

const json& expected_json() {
  static const json j = [] {
    auto bytes = read_file(fixture_dir() / "expected.json");
    return json::parse(reinterpret_cast<const char*>(bytes.data()),
                       reinterpret_cast<const char*>(bytes.data()) + bytes.size());
  }();
  return j;
}

torch_pickle_form form_of(const std::string& fixture) {
  return fixture.find("bucket") != std::string::npos ? torch_pickle_form::flattened_bucket
                                                     : torch_pickle_form::named_list;
}

std::size_t itemsize(const std::string& torch_dtype) {
  return element_size(*dtype_from_torch_name(torch_dtype));
}

std::string hex_of(const std::vector<uint8_t>& b) { return hex_encode(b); }

std::string error_of(std::span<const std::byte> bytes,
                     torch_pickle_form form = torch_pickle_form::named_list,
                     const torch_pickle_limits& limits = {}) {
  auto r = read_torch_ipc_pickle(bytes, form, limits);
  return r ? std::string("(accepted)") : r.error();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- a pickle writer, opcode by opcode -----------------------------------------------------------

class pickle_writer {
public:
  pickle_writer& op(uint8_t code) {
    out_.push_back(static_cast<std::byte>(code));
    return *this;
  }
  pickle_writer& raw(std::string_view s) {
    for (char c : s)
      out_.push_back(static_cast<std::byte>(c));
    return *this;
  }
  pickle_writer& le(uint64_t x, int n) {
    for (int k = 0; k < n; ++k)
      op(static_cast<uint8_t>(x >> (8 * k)));
    return *this;
  }
  pickle_writer& proto(int v = 4) { return op(0x80).op(static_cast<uint8_t>(v)); }
  pickle_writer& str(std::string_view s) { return op(0x8c).le(s.size(), 1).raw(s); }
  pickle_writer& bytes(std::string_view s) { return op('C').le(s.size(), 1).raw(s); }
  pickle_writer& integer(int64_t i) {
    if (i >= 0 && i < 256)
      return op('K').le(static_cast<uint64_t>(i), 1);
    if (i >= INT32_MIN && i <= INT32_MAX)
      return op('J').le(static_cast<uint32_t>(i), 4);
    return op(0x8a).le(8, 1).le(static_cast<uint64_t>(i), 8);
  }
  pickle_writer& none() { return op('N'); }
  pickle_writer& boolean(bool b) { return op(b ? 0x88 : 0x89); }
  pickle_writer& global(std::string_view module, std::string_view name) {
    return str(module).str(name).op(0x93);
  }
  pickle_writer& mark() { return op('('); }
  pickle_writer& tuple() { return op('t'); }
  pickle_writer& stop() { return op('.'); }
  std::vector<std::byte> done() const { return out_; }

private:
  std::vector<std::byte> out_;
};

std::string torch_handle(uint8_t version = 2, char type = 'c') {
  std::string h;
  h += static_cast<char>(version);
  h += type;
  for (int i = 0; i < 64; ++i)
    h += static_cast<char>(i * 5 + 1);
  return h;
}

// rebuild_cuda_tensor's 15 arguments; each field is written by a function so a test can put
// any value (or none) in any slot.
struct tensor_args {
  std::vector<int64_t> shape{4, 8};
  std::vector<int64_t> stride{8, 1};
  int64_t tensor_offset = 2;
  std::string dtype = "bfloat16";
  std::string device_uuid; // empty: device index 0
  std::string handle = torch_handle();
  int64_t storage_size = 4096;
  int64_t storage_offset = 512;
  std::string ref_counter = "/torch_1_2_0";
  int64_t ref_counter_offset = 7;
  std::string event = std::string(64, '\x11');
  std::string rebuild_module = "torch.multiprocessing.reductions";
  std::string rebuild_name = "rebuild_cuda_tensor";
  // Replaces argument `override_index` with whatever `override_value` writes (-1: none).
  int override_index = -1;
  void (*override_value)(pickle_writer&) = nullptr;
  bool drop_last = false; // 14 arguments
};

void write_dims(pickle_writer& w, const std::vector<int64_t>& d) {
  w.mark();
  for (auto x : d)
    w.integer(x);
  w.tuple();
}

void write_tensor(pickle_writer& w, const tensor_args& a) {
  w.global(a.rebuild_module, a.rebuild_name).mark();
  auto arg = [&](int i, auto&& write) {
    if (a.drop_last && i == 14)
      return;
    if (i == a.override_index)
      a.override_value(w);
    else
      write();
  };
  arg(0, [&] { w.global("torch", "Tensor"); });
  arg(1, [&] { w.global("torch", "Size"); write_dims(w, a.shape); w.op(0x85).op('R'); });
  arg(2, [&] { write_dims(w, a.stride); });
  arg(3, [&] { w.integer(a.tensor_offset); });
  arg(4, [&] { w.global("torch.storage", "TypedStorage"); });
  arg(5, [&] { w.global("torch", a.dtype); });
  arg(6, [&] { a.device_uuid.empty() ? w.integer(0) : w.str(a.device_uuid); });
  arg(7, [&] { a.handle.empty() ? w.none() : w.bytes(a.handle); });
  arg(8, [&] { w.integer(a.storage_size); });
  arg(9, [&] { w.integer(a.storage_offset); });
  arg(10, [&] { w.boolean(false); });
  arg(11, [&] { a.ref_counter.empty() ? w.none() : w.bytes(a.ref_counter); });
  arg(12, [&] { w.integer(a.ref_counter_offset); });
  arg(13, [&] { a.event.empty() ? w.none() : w.bytes(a.event); });
  arg(14, [&] { w.boolean(!a.event.empty()); });
  w.tuple().op('R');
}

// [("w", tensor)]
std::vector<std::byte> list_pickle(const tensor_args& a, std::string_view name = "w") {
  pickle_writer w;
  w.proto().op(']').mark().str(name);
  write_tensor(w, a);
  w.op(0x86).op('e').stop();
  return w.done();
}

struct meta {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t start, end, numel;
};

// {"flattened_tensor": tensor, "metadata": [FlattenedTensorMetadata, ...]}
std::vector<std::byte> bucket_pickle(const tensor_args& flat, const std::vector<meta>& metas) {
  pickle_writer w;
  w.proto().op('}').mark().str("flattened_tensor");
  write_tensor(w, flat);
  w.str("metadata").op(']').mark();
  for (const auto& m : metas) {
    w.global("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata").op(')').op(0x81);
    w.op('}').mark();
    w.str("name").str(m.name).str("shape").global("torch", "Size");
    write_dims(w, m.shape);
    w.op(0x85).op('R');
    w.str("dtype").global("torch", m.dtype);
    w.str("start_idx").integer(m.start).str("end_idx").integer(m.end).str("numel").integer(m.numel);
    w.op('u').op('b');
  }
  w.op('e').op('u').stop();
  return w.done();
}

tensor_args flat_u8(int64_t n) {
  tensor_args a;
  a.shape = {n};
  a.stride = {1};
  a.tensor_offset = 0;
  a.dtype = "uint8";
  a.storage_size = n;
  return a;
}

} // namespace

BOOST_AUTO_TEST_SUITE(torch_pickle_test)

// ---- fixtures ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(fixtures_read_back_to_expected_json) {
  const auto& e = expected_json();
  const std::string uuid = "GPU-" + e["device_uuid_text"].get<std::string>();
  const std::string rc_handle = e["ref_counter_probe"]["handle"].get<std::string>();
  BOOST_TEST(e["fixtures"].size() == 10u);
  for (const auto& [file, fx] : e["fixtures"].items()) {
    BOOST_TEST_CONTEXT(file) {
      const auto bytes = read_file(fixture_dir() / file);
      BOOST_TEST(bytes.size() == fx["nbytes"].get<std::size_t>());
      auto got = read_torch_ipc_pickle(bytes, form_of(file));
      BOOST_TEST_REQUIRE(got.has_value(), got.error());
      const bool patched = fx["sglang_patch"].get<bool>();
      auto check_common = [&](const DeviceTensorRef& t, const json& src) {
        BOOST_TEST(hex_of(t.ipc_handle) == src["handle_hex"].get<std::string>());
        BOOST_TEST(t.ipc_handle.size() == 66u);
        if (patched) {
          BOOST_TEST(t.device_uuid == uuid);
          BOOST_TEST(t.device == 0);
        } else {
          BOOST_TEST(t.device_uuid.empty());
          BOOST_TEST(t.device == src["device"].get<int>());
        }
        BOOST_TEST(t.event_handle.size() == 64u);
        BOOST_TEST(t.event_sync_required);
        BOOST_TEST(t.pointer == 0u);
      };
      if (form_of(file) == torch_pickle_form::named_list) {
        std::vector<json> present;
        for (const auto& t : fx["tensors"])
          if (!t["handle_hex"].is_null())
            present.push_back(t);
        BOOST_TEST_REQUIRE(got->size() == present.size());
        std::set<uint64_t> slots;
        for (std::size_t i = 0; i < present.size(); ++i) {
          const auto& want = present[i];
          const auto& [name, t] = (*got)[i];
          BOOST_TEST_CONTEXT(name) {
            const auto item = itemsize(want["dtype"].get<std::string>());
            BOOST_TEST(name == want["name"].get<std::string>());
            BOOST_TEST(std::string(torch_name(t.type)) == want["dtype"].get<std::string>());
            BOOST_TEST(t.shape == want["shape"].get<std::vector<int64_t>>());
            BOOST_TEST(t.offset == want["storage_offset_bytes"].get<uint64_t>() +
                                     want["storage_offset_elements"].get<uint64_t>() * item);
            int64_t numel = 1;
            for (auto d : t.shape)
              numel *= d;
            BOOST_TEST(t.nbytes == static_cast<uint64_t>(numel) * item);
            check_common(t, want);
            // Every pickled tensor owns its own slot, views of one storage included.
            BOOST_TEST(t.ref_counter_handle == rc_handle);
            slots.insert(t.ref_counter_offset);
          }
        }
        BOOST_TEST(slots.size() == present.size());
      } else {
        const auto& flat = fx["tensors"][0];
        const auto& metas = fx["metadata"];
        BOOST_TEST_REQUIRE(got->size() == metas.size());
        if (metas.empty())
          continue; // the filler bucket: nothing to read
        const auto flat_item = itemsize(flat["dtype"].get<std::string>());
        const uint64_t base = flat["storage_offset_bytes"].get<uint64_t>() +
                              flat["storage_offset_elements"].get<uint64_t>() * flat_item;
        for (std::size_t i = 0; i < metas.size(); ++i) {
          const auto& m = metas[i];
          const auto& [name, t] = (*got)[i];
          BOOST_TEST_CONTEXT(name) {
            BOOST_TEST(name == m["name"].get<std::string>());
            BOOST_TEST(std::string(torch_name(t.type)) == m["dtype"].get<std::string>());
            BOOST_TEST(t.shape == m["shape"].get<std::vector<int64_t>>());
            BOOST_TEST(t.offset == base + m["start_idx"].get<uint64_t>() * flat_item);
            BOOST_TEST(t.nbytes * 2 == fx["values_hex"][name].get<std::string>().size());
            check_common(t, flat);
            // One pickled tensor, one decrement: only the first ref carries the slot.
            BOOST_TEST(t.ref_counter_handle == (i == 0 ? rc_handle : std::string()));
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(fixtures_written_by_torch_2_11) {
  const auto& e = expected_json();
  BOOST_TEST(e["torch_version"].get<std::string>().rfind("2.11", 0) == 0);
  // What docs/formats.md states about the files the runner touches.
  BOOST_TEST(e["ref_counter_probe"]["slots_start_at_byte"].get<int>() == 64);
  BOOST_TEST(e["ref_counter_probe"]["event_handle_len"].get<int>() == 64);
  auto uuid = normalize_device_uuid(e["device_uuid_text"].get<std::string>());
  BOOST_TEST_REQUIRE(uuid.has_value(), uuid.error());
  BOOST_TEST(*uuid == "GPU-4b652ae2-0ec6-7dcb-611e-8bd2e51d9120");
}

// A stream cut at any byte is refused (never read past its end, never accepted).
BOOST_AUTO_TEST_CASE(every_truncation_is_refused) {
  for (const auto& [file, fx] : expected_json()["fixtures"].items()) {
    const auto bytes = read_file(fixture_dir() / file);
    // The 68 KB list: every 61st length (each read is linear, all of them quadratic).
    const std::size_t step = bytes.size() > 8192 ? 61 : 1;
    for (std::size_t n = 0; n < bytes.size(); n += step) {
      auto err = error_of(std::span(bytes).first(n), form_of(file));
      BOOST_TEST(starts_with(err, "byte "), file << " cut at " << n << ": " << err);
    }
  }
}

// ---- hostile streams -----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_classic_exploit_is_refused) {
  const std::string p0 = "cos\nsystem\n(S'ls'\ntR.";
  std::vector<std::byte> b(p0.size());
  std::memcpy(b.data(), p0.data(), p0.size());
  BOOST_TEST(starts_with(error_of(b), "byte 0: global os.system (GLOBAL) is not allowed: rlserve "
                                      "reads only PyTorch's CUDA tensors"));
}

BOOST_AUTO_TEST_CASE(unknown_globals_are_refused_by_name) {
  for (auto [module, name] : {std::pair{"builtins", "eval"}, {"os", "system"}, {"posix", "system"},
                              {"torch", "load"}, {"torch.storage", "_load_from_bytes"},
                              {"sglang.srt.model_executor.model_runner", "LocalSerializedTensor"}}) {
    pickle_writer w;
    w.proto().global(module, name).stop();
    const auto at = 2 + 2 + std::strlen(module) + 2 + std::strlen(name); // the STACK_GLOBAL
    const auto err = error_of(w.done());
    BOOST_TEST(starts_with(err, "byte " + std::to_string(at) + ": global " + module + "." + name +
                                  " (STACK_GLOBAL) is not allowed"),
               err);
  }
  // A CPU tensor's reduction: the hint says what to send instead.
  pickle_writer w;
  w.proto().global("torch.multiprocessing.reductions", "rebuild_storage_fd").stop();
  BOOST_TEST(contains(error_of(w.done()), "not on a CUDA device"));
  // torch.<dtype> only for the dtypes rlserve has.
  tensor_args a;
  a.dtype = "complex64";
  BOOST_TEST(contains(error_of(list_pickle(a)), "global torch.complex64 (STACK_GLOBAL) is not allowed"));
}

BOOST_AUTO_TEST_CASE(opcodes_outside_the_list_are_refused_by_name) {
  struct c {
    uint8_t op;
    std::string want;
  };
  for (const auto& [op, want] :
       {c{'S', "byte 2: opcode STRING (0x53) is not accepted"}, c{'2', "byte 2: opcode DUP (0x32)"},
        c{'P', "byte 2: opcode PERSID (0x50)"}, c{'i', "byte 2: opcode INST (0x69)"},
        c{0x97, "byte 2: opcode NEXT_BUFFER (0x97)"}, c{0x92, "byte 2: opcode NEWOBJ_EX (0x92)"},
        c{0xff, "byte 2: unknown opcode 0xff"}, c{0x00, "byte 2: unknown opcode 0x00"}}) {
    pickle_writer w;
    w.proto().op(op).stop();
    BOOST_TEST(starts_with(error_of(w.done()), want), error_of(w.done()));
  }
  for (int v : {0, 1, 6}) {
    pickle_writer w;
    w.proto(v).none().stop();
    BOOST_TEST(error_of(w.done()) ==
               "byte 0: pickle protocol " + std::to_string(v) + "; rlserve reads protocols 2 to 5");
  }
  // The accepted list is exactly what PyTorch writes for these objects.
  const std::set<std::string_view> accepted(torch_pickle_opcodes().begin(),
                                            torch_pickle_opcodes().end());
  const std::set<std::string_view> want{
    "PROTO", "FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "MARK",
    "EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "TUPLE", "APPEND",
    "APPENDS", "SETITEM", "SETITEMS", "SHORT_BINUNICODE", "BINUNICODE", "SHORT_BINBYTES",
    "BINBYTES", "BININT", "BININT1", "BININT2", "LONG1", "NONE", "NEWTRUE", "NEWFALSE",
    "STACK_GLOBAL", "GLOBAL", "REDUCE", "NEWOBJ", "BUILD", "STOP"};
  BOOST_TEST((accepted == want));
}

BOOST_AUTO_TEST_CASE(memo_stack_and_sizes_are_bounded) {
  {
    pickle_writer w; // BINGET of an entry nobody set
    w.proto().op('h').le(3, 1).stop();
    BOOST_TEST(error_of(w.done()) == "byte 2: BINGET reads memo entry 3, which was never set");
  }
  {
    pickle_writer w; // LONG_BINPUT far past the limit
    w.proto().none().op('r').le(0xffffffffu, 4).stop();
    BOOST_TEST(starts_with(error_of(w.done()), "byte 3: memo index 4294967295 is past the limit"));
  }
  {
    pickle_writer w; // deep nesting
    w.proto();
    for (int i = 0; i < 100; ++i)
      w.mark();
    BOOST_TEST(error_of(w.done()) == "byte 66: more than 64 nested MARKs (the limit)");
  }
  {
    pickle_writer w; // a string of 4 GiB announced, 0 bytes there
    w.proto().op('X').le(0xffffffffu, 4).stop();
    BOOST_TEST(starts_with(error_of(w.done()),
                           "byte 2: BINUNICODE of 4294967295 bytes exceeds the limit of 65536"));
  }
  {
    pickle_writer w; // within the limit but past the end
    w.proto().op('B').le(1000, 4).raw("abc");
    BOOST_TEST(error_of(w.done()) ==
               "byte 2: the pickle ends inside BINBYTES (it needs 1000 more bytes, 3 are left)");
  }
  {
    pickle_writer w;
    w.proto().op(0x95).le(uint64_t{1} << 40, 8).none().stop();
    BOOST_TEST(starts_with(error_of(w.done()), "byte 2: FRAME of 1099511627776 bytes"));
  }
  {
    pickle_writer w; // LONG1 wider than int64
    w.proto().op(0x8a).le(200, 1).stop();
    BOOST_TEST(error_of(w.done()) == "byte 2: LONG1 of 200 bytes is wider than 64 bits");
  }
  {
    pickle_writer w; // negative LONG1 sign-extends; rejected later as a count, not as garbage
    w.proto().op(0x8a).le(1, 1).le(0xff, 1).stop();
    BOOST_TEST(starts_with(error_of(w.done()), "the pickle holds an int; expected a list"));
  }
  torch_pickle_limits tight;
  tight.max_stack = 100;
  tight.max_objects = 1000;
  tight.max_items = 50;
  {
    pickle_writer w;
    w.proto();
    for (int i = 0; i < 200; ++i)
      w.op(']');
    BOOST_TEST(starts_with(error_of(w.done(), torch_pickle_form::named_list, tight),
                           "byte 102: more than 100 values on the pickle stack"));
  }
  {
    pickle_writer w; // a list that grows by APPEND past max_items
    w.proto().op(']').op(0x94);
    for (int i = 0; i < 60; ++i)
      w.op('h').le(0, 1).op('a');
    w.stop();
    BOOST_TEST(contains(error_of(w.done(), torch_pickle_form::named_list, tight),
                        "a container of 51 elements exceeds the limit of 50"));
  }
  {
    pickle_writer w; // many small values, in tuples small enough for max_items
    w.proto();
    for (int i = 0; i < 40; ++i) {
      w.mark();
      for (int k = 0; k < 40; ++k)
        w.none();
      w.tuple();
    }
    w.stop();
    BOOST_TEST(contains(error_of(w.done(), torch_pickle_form::named_list, tight),
                        "the pickle makes more than 1000 values"));
  }
  {
    pickle_writer w; // a list that contains itself is harmless (and not a list of tuples)
    w.proto().op(']').op(0x94).op('h').le(0, 1).op('a').stop();
    BOOST_TEST(starts_with(error_of(w.done()), "element 0 of the list is a list"));
  }
  {
    std::vector<std::byte> big(100);
    torch_pickle_limits small;
    small.max_bytes = 99;
    BOOST_TEST(error_of(big, torch_pickle_form::named_list, small) ==
               "the pickle has 100 bytes, more than the limit of 99");
  }
  {
    pickle_writer w; // invalid UTF-8 in a name
    w.proto().str("\xff\xfe").stop();
    BOOST_TEST(error_of(w.done()) == "byte 2: SHORT_BINUNICODE is not valid UTF-8");
  }
  {
    pickle_writer w;
    w.proto().none().none().stop();
    BOOST_TEST(starts_with(error_of(w.done()), "byte 4: STOP with 2 values on the stack"));
  }
  {
    pickle_writer w;
    w.proto().none().stop().none();
    BOOST_TEST(error_of(w.done()) == "byte 3: 1 bytes follow STOP");
  }
  {
    pickle_writer w; // REDUCE of an allowed class that is never called
    w.proto().global("torch", "Tensor").op(')').op('R').stop();
    BOOST_TEST(starts_with(error_of(w.done()), "byte 19: REDUCE calls torch.Tensor, which rlserve "
                                               "does not call"));
  }
}

// ---- the 15 arguments ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_hand_written_tensor_reads_back) {
  tensor_args a;
  auto got = read_torch_ipc_pickle(list_pickle(a), torch_pickle_form::named_list);
  BOOST_TEST_REQUIRE(got.has_value(), got.error());
  BOOST_TEST_REQUIRE(got->size() == 1u);
  const auto& t = (*got)[0].tensor;
  BOOST_TEST(t.offset == 512u + 2 * 2);
  BOOST_TEST(t.nbytes == 4u * 8 * 2);
  BOOST_TEST(t.ref_counter_handle == "/torch_1_2_0");
  BOOST_TEST(t.ref_counter_offset == 7u);
  // SGLang's rebuild under both module paths, device as UUID text in any case.
  for (auto module : {"sglang.srt.utils.patch_torch", "sglang.srt.patch_torch"}) {
    a.rebuild_module = module;
    a.rebuild_name = "_rebuild_cuda_tensor_modified";
    a.device_uuid = "4B652AE2-0EC6-7DCB-611E-8BD2E51D9120";
    got = read_torch_ipc_pickle(list_pickle(a), torch_pickle_form::named_list);
    BOOST_TEST_REQUIRE(got.has_value(), got.error());
    BOOST_TEST((*got)[0].tensor.device_uuid == "GPU-4b652ae2-0ec6-7dcb-611e-8bd2e51d9120");
  }
  // A raw 64-byte handle and a version-3 handle are accepted; size-1 dimensions take any stride.
  a = tensor_args{};
  a.handle = torch_handle().substr(2);
  a.shape = {4, 1, 8};
  a.stride = {8, 77, 1};
  got = read_torch_ipc_pickle(list_pickle(a), torch_pickle_form::named_list);
  BOOST_TEST_REQUIRE(got.has_value(), got.error());
  BOOST_TEST((*got)[0].tensor.ipc_handle.size() == 64u);
  a.handle = torch_handle(3);
  BOOST_TEST(read_torch_ipc_pickle(list_pickle(a), torch_pickle_form::named_list).has_value());
  // No storage and no elements: nothing to read.
  a = tensor_args{};
  a.shape = {0};
  a.stride = {1};
  a.handle.clear();
  a.ref_counter.clear();
  a.event.clear();
  a.storage_size = 0;
  got = read_torch_ipc_pickle(list_pickle(a), torch_pickle_form::named_list);
  BOOST_TEST_REQUIRE(got.has_value(), got.error());
  BOOST_TEST(got->empty());
}

BOOST_AUTO_TEST_CASE(bad_arguments_name_the_tensor) {
  const std::string at = R"(tensor "w" (pickled at byte )";
  auto check = [&](const tensor_args& a, const std::string& part) {
    auto err = error_of(list_pickle(a));
    BOOST_TEST(starts_with(err, at), err);
    BOOST_TEST(contains(err, part), err);
  };
  tensor_args a;
  a.drop_last = true;
  check(a, "rebuild_cuda_tensor has 14 arguments; expected 15");

  a = tensor_args{};
  a.override_index = 6;
  a.override_value = [](pickle_writer& w) { w.op(']'); };
  check(a, "argument 6 (storage_device) of rebuild_cuda_tensor is a list; expected an int (device "
           "index) or a str (device UUID)");
  a.override_index = 0;
  a.override_value = [](pickle_writer& w) { w.global("torch", "Size"); };
  check(a, "argument 0 (tensor_cls) of rebuild_cuda_tensor is a class or function; expected "
           "torch.Tensor");
  a.override_index = 7;
  a.override_value = [](pickle_writer& w) { w.str("handle"); };
  check(a, "argument 7 (storage_handle) of rebuild_cuda_tensor is a str; expected bytes or None");
  a.override_index = 9;
  a.override_value = [](pickle_writer& w) { w.integer(-1); };
  check(a, "argument 9 (storage_offset_bytes) of rebuild_cuda_tensor is an int; expected a "
           "non-negative int");
  a.override_index = 1;
  a.override_value = [](pickle_writer& w) { w.none(); };
  check(a, "tensor_size is None; expected a tuple of ints");

  a = tensor_args{};
  a.device_uuid = "GPU-4b652ae2";
  check(a, R"(storage_device: "GPU-4b652ae2" is not a GPU UUID)");

  a = tensor_args{};
  a.handle = torch_handle(2, 'e');
  check(a, "storage_handle: this handle is an expandable segment (type 'e'), which CUDA IPC "
           "cannot open; unset expandable_segments in PYTORCH_CUDA_ALLOC_CONF on the trainer");
  a.handle = torch_handle(4);
  check(a, "storage_handle: handle version 4; rlserve reads versions 2 and 3");
  a.handle = "short";
  check(a, "storage_handle: 5 bytes; expected 64");

  a = tensor_args{};
  a.stride = {1, 4};
  check(a, "strides [1, 4] of shape [4, 8] are not contiguous (expected [8, 1]); call "
           ".contiguous() on the tensor before sending it");
  a.stride = {8};
  check(a, "1 strides for a shape of 2 dimensions");

  a = tensor_args{};
  a.tensor_offset = 2048;
  check(a, "elements 2048..2080 of bfloat16 end at byte 4160, past the storage's 4096 bytes");

  a = tensor_args{};
  a.handle.clear();
  check(a, "32 elements but no storage");

  a = tensor_args{};
  a.event = "abc";
  check(a, "event_handle has 3 bytes; a cudaIpcEventHandle_t has 64");

  a = tensor_args{};
  a.ref_counter = "/../../etc/passwd";
  check(a, R"(ref_counter_handle: "/../../etc/passwd" is not a shared-memory name)");

  a = tensor_args{};
  a.shape = {int64_t{1} << 40, int64_t{1} << 40};
  a.stride = {int64_t{1} << 40, 1};
  check(a, "overflows int64 bytes");
}

BOOST_AUTO_TEST_CASE(the_pickle_must_match_load_format) {
  tensor_args a;
  BOOST_TEST(starts_with(error_of(list_pickle(a), torch_pickle_form::flattened_bucket),
                         "the pickle holds a list; expected a dict"));
  auto b = bucket_pickle(flat_u8(64), {{"x", {32}, "uint8", 0, 32, 32}});
  BOOST_TEST(starts_with(error_of(b, torch_pickle_form::named_list),
                         "the pickle holds a dict; expected a list of (name, tensor) tuples"));
}

BOOST_AUTO_TEST_CASE(buckets_are_split_and_checked) {
  // Byte-indexed (uint8) bucket of two dtypes.
  auto b = bucket_pickle(flat_u8(64), {{"a", {4, 4}, "bfloat16", 0, 32, 32},
                                       {"b", {8}, "float32", 32, 64, 32}});
  auto got = read_torch_ipc_pickle(b, torch_pickle_form::flattened_bucket);
  BOOST_TEST_REQUIRE(got.has_value(), got.error());
  BOOST_TEST_REQUIRE(got->size() == 2u);
  BOOST_TEST((*got)[1].tensor.offset == 512u + 32);
  BOOST_TEST((*got)[1].tensor.nbytes == 32u);
  BOOST_TEST(((*got)[1].tensor.type == dtype::f32));
  BOOST_TEST((*got)[0].tensor.ref_counter_handle == "/torch_1_2_0");
  BOOST_TEST((*got)[1].tensor.ref_counter_handle.empty());
  BOOST_TEST((*got)[1].tensor.event_handle.size() == 64u);

  auto err = [](const std::vector<meta>& m) {
    return error_of(bucket_pickle(flat_u8(64), m), torch_pickle_form::flattened_bucket);
  };
  BOOST_TEST(err({{"a", {40}, "uint8", 30, 70, 40}}) ==
             R"(metadata[0] ("a"): start_idx 30 .. end_idx 70 is outside flattened_tensor's 64 elements)");
  BOOST_TEST(err({{"a", {4}, "uint8", 10, 4, 0}}) ==
             R"(metadata[0] ("a"): start_idx 10 .. end_idx 4 is outside flattened_tensor's 64 elements)");
  BOOST_TEST(err({{"a", {4}, "uint8", 0, 4, 5}}) ==
             R"(metadata[0] ("a"): numel 5 differs from end_idx - start_idx = 4)");
  BOOST_TEST(err({{"a", {4}, "bfloat16", 0, 4, 4}}) ==
             R"(metadata[0] ("a"): shape [4] of bfloat16 needs 8 bytes, but start_idx..end_idx spans 4 bytes of flattened_tensor (uint8))");
  BOOST_TEST(starts_with(err({}), "flattened_tensor holds 64 bytes but metadata describes no tensor"));

  // Element-indexed (one dtype): indices count bfloat16 elements.
  tensor_args flat = flat_u8(0);
  flat.dtype = "bfloat16";
  flat.shape = {32};
  flat.storage_size = 64;
  got = read_torch_ipc_pickle(bucket_pickle(flat, {{"a", {2, 8}, "bfloat16", 0, 16, 16},
                                                   {"b", {16}, "bfloat16", 16, 32, 16}}),
                              torch_pickle_form::flattened_bucket);
  BOOST_TEST_REQUIRE(got.has_value(), got.error());
  BOOST_TEST((*got)[1].tensor.offset == 512u + 32);

  // The flattened tensor itself gets the argument checks.
  flat = flat_u8(64);
  flat.handle = torch_handle(2, 'e');
  BOOST_TEST(starts_with(error_of(bucket_pickle(flat, {{"a", {64}, "uint8", 0, 64, 64}}),
                                  torch_pickle_form::flattened_bucket),
                         "flattened_tensor (pickled at byte"));

  // Metadata that is not a FlattenedTensorMetadata.
  pickle_writer w;
  w.proto().op('}').mark().str("flattened_tensor");
  write_tensor(w, flat_u8(64));
  w.str("metadata").op(']').mark().integer(3).op('e').op('u').stop();
  BOOST_TEST(error_of(w.done(), torch_pickle_form::flattened_bucket) ==
             "metadata[0] is an int; expected a FlattenedTensorMetadata");
  pickle_writer x;
  x.proto().op('}').mark().str("flattened_tensor");
  write_tensor(x, flat_u8(64));
  x.str("extra").none().op('u').stop();
  BOOST_TEST(starts_with(error_of(x.done(), torch_pickle_form::flattened_bucket),
                         R"(the bucket has a key "extra")"));
}

// ---- through the JSON codec ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(serialized_named_tensors_fill_device_tensors) {
  auto b64 = [](const std::string& file) { return base64_encode(read_file(fixture_dir() / file)); };
  // The list form; elements past 0 belong to other engine GPUs and are not read.
  json body = {{"serialized_named_tensors", {b64("sglang_list.pkl"), "not read"}},
               {"weight_version", "7"}, {"flush_cache", false}};
  auto x = from_json<UpdateWeightsFromTensorReqInput>(body);
  BOOST_TEST_REQUIRE(x.has_value(), x.error());
  auto direct = read_torch_ipc_pickle(read_file(fixture_dir() / "sglang_list.pkl"),
                                      torch_pickle_form::named_list);
  BOOST_TEST_REQUIRE(x->device_tensors.size() == direct->size());
  for (std::size_t i = 0; i < direct->size(); ++i)
    BOOST_TEST(to_json(x->device_tensors[i]) == to_json((*direct)[i]));
  // rlserve's own JSON form carries everything the pickle said (ref counters included).
  auto back = from_json<UpdateWeightsFromTensorReqInput>(to_json(*x));
  BOOST_TEST_REQUIRE(back.has_value(), back.error());
  BOOST_TEST(to_json(*back) == to_json(*x));

  // The bucket form, next to an inline tensor.
  body = {{"serialized_named_tensors", {b64("sglang_bucket_bytes.pkl")}},
          {"load_format", "flattened_bucket"},
          {"named_tensors", {{{"name", "inline"}, {"dtype", "int8"}, {"shape", {1}}, {"data", "AA=="}}}}};
  x = from_json<UpdateWeightsFromTensorReqInput>(body);
  BOOST_TEST_REQUIRE(x.has_value(), x.error());
  BOOST_TEST(x->device_tensors.size() == 3u);
  BOOST_TEST(x->named_tensors.size() == 1u);
  BOOST_TEST(x->load_format.value_or("") == "flattened_bucket");

  // slime's filler bucket: nothing to load, not an error.
  body = {{"serialized_named_tensors", {b64("sglang_bucket_empty.pkl")}},
          {"load_format", "flattened_bucket"}};
  x = from_json<UpdateWeightsFromTensorReqInput>(body);
  BOOST_TEST_REQUIRE(x.has_value(), x.error());
  BOOST_TEST(x->device_tensors.empty());

  // The wrong load_format, a name twice, a bad stream: each names the element.
  body = {{"serialized_named_tensors", {b64("plain_bucket_bytes.pkl")}}};
  BOOST_TEST(starts_with(from_json<UpdateWeightsFromTensorReqInput>(body).error(),
                         "serialized_named_tensors[0]: the pickle holds a dict; expected a list"));
  body = {{"serialized_named_tensors", {b64("plain_bucket_bytes.pkl")}},
          {"load_format", "flattened_bucket"},
          {"named_tensors", {{{"name", "w2"}, {"dtype", "int8"}, {"shape", {1}}, {"data", "AA=="}}}}};
  BOOST_TEST(from_json<UpdateWeightsFromTensorReqInput>(body).error() ==
             R"(serialized_named_tensors[0]: duplicate of named_tensors[0].name ("w2"))");
  auto twice = base64_encode(list_pickle(tensor_args{}, "same"));
  {
    pickle_writer w;
    w.proto().op(']').mark();
    for (int i = 0; i < 2; ++i) {
      w.str("same");
      write_tensor(w, tensor_args{});
      w.op(0x86);
    }
    w.op('e').stop();
    twice = base64_encode(w.done());
  }
  body = {{"serialized_named_tensors", {twice}}};
  BOOST_TEST(from_json<UpdateWeightsFromTensorReqInput>(body).error() ==
             R"(serialized_named_tensors[0]: duplicate of an earlier tensor of serialized_named_tensors[0] ("same"))");
  tensor_args strided;
  strided.stride = {1, 4};
  body = {{"serialized_named_tensors", {base64_encode(list_pickle(strided, "model.w"))}}};
  BOOST_TEST(starts_with(from_json<UpdateWeightsFromTensorReqInput>(body).error(),
                         R"(serialized_named_tensors[0]: tensor "model.w" (pickled at byte )"));
}

BOOST_AUTO_TEST_SUITE_END()
