// The restricted pickle machine behind read_torch_ipc_pickle (see torch_pickle.hpp).
//
// Two passes. run() executes the opcodes into an arena of values (no Python object is ever
// made, no function called: REDUCE of a rebuild function just records its argument tuple).
// Then interpret the result against the one schema the request's load_format names, checking
// every argument of every tensor. Values live in vectors indexed by `ref`, so a hostile stream
// that makes a list contain itself costs nothing special and everything is freed at once.
#include "messages/torch_pickle.hpp"

#include <array>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

namespace rlserve {

namespace {

// ---- opcodes ------------------------------------------------------------------------------------

// Every opcode of pickle protocols 0..5, named as Python's pickletools names them, so a refusal
// can say which one it met. `accepted`: the reader executes it.
struct opcode_info {
  uint8_t code;
  std::string_view name;
  bool accepted;
};

constexpr std::array<opcode_info, 68> k_opcodes{{
  {'(', "MARK", true},          {'.', "STOP", true},           {'0', "POP", false},
  {'1', "POP_MARK", false},     {'2', "DUP", false},           {'F', "FLOAT", false},
  {'I', "INT", false},          {'J', "BININT", true},         {'K', "BININT1", true},
  {'L', "LONG", false},         {'M', "BININT2", true},        {'N', "NONE", true},
  {'P', "PERSID", false},       {'Q', "BINPERSID", false},     {'R', "REDUCE", true},
  {'S', "STRING", false},       {'T', "BINSTRING", false},     {'U', "SHORT_BINSTRING", false},
  {'V', "UNICODE", false},      {'X', "BINUNICODE", true},     {'a', "APPEND", true},
  {'b', "BUILD", true},         {'c', "GLOBAL", true},         {'d', "DICT", false},
  {'}', "EMPTY_DICT", true},    {'e', "APPENDS", true},        {'g', "GET", false},
  {'h', "BINGET", true},        {'i', "INST", false},          {'j', "LONG_BINGET", true},
  {'l', "LIST", false},         {']', "EMPTY_LIST", true},     {'o', "OBJ", false},
  {'p', "PUT", false},          {'q', "BINPUT", true},         {'r', "LONG_BINPUT", true},
  {'s', "SETITEM", true},       {'t', "TUPLE", true},          {')', "EMPTY_TUPLE", true},
  {'u', "SETITEMS", true},      {'G', "BINFLOAT", false},      {0x80, "PROTO", true},
  {0x81, "NEWOBJ", true},       {0x82, "EXT1", false},         {0x83, "EXT2", false},
  {0x84, "EXT4", false},        {0x85, "TUPLE1", true},        {0x86, "TUPLE2", true},
  {0x87, "TUPLE3", true},       {0x88, "NEWTRUE", true},       {0x89, "NEWFALSE", true},
  {0x8a, "LONG1", true},        {0x8b, "LONG4", false},        {'B', "BINBYTES", true},
  {'C', "SHORT_BINBYTES", true}, {0x8c, "SHORT_BINUNICODE", true},
  {0x8d, "BINUNICODE8", false}, {0x8e, "BINBYTES8", false},    {0x8f, "EMPTY_SET", false},
  {0x90, "ADDITEMS", false},    {0x91, "FROZENSET", false},    {0x92, "NEWOBJ_EX", false},
  {0x93, "STACK_GLOBAL", true}, {0x94, "MEMOIZE", true},       {0x95, "FRAME", true},
  {0x96, "BYTEARRAY8", false},  {0x97, "NEXT_BUFFER", false},  {0x98, "READONLY_BUFFER", false},
}};

const opcode_info* find_opcode(uint8_t code) {
  for (const auto& op : k_opcodes)
    if (op.code == code)
      return &op;
  return nullptr;
}

std::string_view opcode_name(uint8_t code) {
  auto op = find_opcode(code);
  return op ? op->name : std::string_view("?");
}

// ---- globals ------------------------------------------------------------------------------------

enum class global_id : uint8_t {
  rebuild_cuda_tensor = 1, // torch's, device as an index
  rebuild_cuda_tensor_sglang, // SGLang's patch, device as a UUID string (or an index)
  tensor_class,
  parameter_class,
  size_class,
  storage_class,
  dtype_object,
  metadata_class,
};

struct global_info {
  std::string_view module;
  std::string_view name;
  global_id id;
};

constexpr std::array<global_info, 12> k_globals{{
  {"torch.multiprocessing.reductions", "rebuild_cuda_tensor", global_id::rebuild_cuda_tensor},
  {"sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified",
   global_id::rebuild_cuda_tensor_sglang},
  {"sglang.srt.patch_torch", "_rebuild_cuda_tensor_modified",
   global_id::rebuild_cuda_tensor_sglang},
  {"torch", "Tensor", global_id::tensor_class},
  {"torch.nn.parameter", "Parameter", global_id::parameter_class},
  {"torch", "Size", global_id::size_class},
  {"torch.storage", "TypedStorage", global_id::storage_class},
  {"torch.storage", "UntypedStorage", global_id::storage_class},
  {"torch", "UntypedStorage", global_id::storage_class},
  {"sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata", global_id::metadata_class},
  {"sglang.srt.model_executor.model_runner", "FlattenedTensorMetadata",
   global_id::metadata_class},
  // torch.<dtype> is matched separately (one entry per dtype.hpp type).
  {"torch", "<dtype>", global_id::dtype_object},
}};

constexpr dtype k_all_dtypes[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64, dtype::i8,
                                  dtype::u8,  dtype::i16, dtype::i32,  dtype::i64, dtype::boolean};

// A byte string from the stream, fit for an error message: printable ASCII kept, everything
// else escaped, cut after 80 characters.
std::string printable(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= 80) {
      out += "...";
      break;
    }
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t n = 0; // continuation bytes
    uint32_t cp = 0;
    if ((c >> 5) == 0x6) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c >> 4) == 0xe) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c >> 3) == 0x1e) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n >= s.size() - i)
      return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2)
        return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8. (Pickle can
    // carry lone surrogates, but no tensor name has one, and replies could not echo it.)
    if ((n == 1 && cp < 0x80) || (n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
      return false;
    i += n + 1;
  }
  return true;
}

// ---- values -------------------------------------------------------------------------------------

using ref = uint32_t;
constexpr ref no_ref = 0xffffffffu;

enum class kind : uint8_t {
  none,
  boolean,
  integer,
  text,
  bytes,
  tuple,
  list,
  dict,       // items: key, value, key, value, ...
  global,     // aux: global_id; i: dtype for torch.<dtype>
  size,       // torch.Size(...): items are the dimensions
  tensor,     // a recorded rebuild call: a = the argument tuple
  instance,   // NEWOBJ of FlattenedTensorMetadata: a = the state dict (no_ref before BUILD)
};

struct value {
  kind k = kind::none;
  uint8_t aux = 0;
  uint32_t at = 0;  // byte offset of the opcode that made it
  int64_t i = 0;    // boolean / integer / dtype
  uint32_t a = 0;   // text/bytes/global: offset into chars; containers: index into seqs
  uint32_t b = 0;   // text/bytes/global: length
};

// What a value is, for "... is <this>; expected ..." messages.
std::string_view kind_phrase(kind k) {
  switch (k) {
    case kind::none: return "None";
    case kind::boolean: return "a bool";
    case kind::integer: return "an int";
    case kind::text: return "a str";
    case kind::bytes: return "bytes";
    case kind::tuple: return "a tuple";
    case kind::list: return "a list";
    case kind::dict: return "a dict";
    case kind::global: return "a class or function";
    case kind::size: return "a torch.Size";
    case kind::tensor: return "a tensor";
    case kind::instance: return "an object";
  }
  return "a value";
}

struct stream_error {
  std::string message;
};

// ---- pass 1: the machine ------------------------------------------------------------------------

class machine {
public:
  machine(std::span<const std::byte> in, const torch_pickle_limits& limits)
    : in_(reinterpret_cast<const uint8_t*>(in.data())), size_(in.size()), lim_(limits) {}

  // Runs to STOP; returns the value left on the stack.
  expected<ref> run() {
    if (size_ > lim_.max_bytes)
      return fail(fmt::format("the pickle has {} bytes, more than the limit of {}", size_,
                              lim_.max_bytes));
    try {
      while (true) {
        if (pos_ >= size_)
          throw_at(pos_, "the pickle ends without STOP (truncated?)");
        const std::size_t at = pos_;
        const uint8_t op = in_[pos_++];
        if (step(op, at))
          break;
      }
    } catch (stream_error& e) {
      return fail(std::move(e.message));
    }
    return result_;
  }

  const value& at(ref r) const { return values_[r]; }
  std::string_view chars(const value& v) const { return {chars_.data() + v.a, v.b}; }
  const std::vector<ref>& items(const value& v) const { return seqs_[v.a]; }

private:
  [[noreturn]] void throw_at(std::size_t at, std::string what) {
    throw stream_error{fmt::format("byte {}: {}", at, what)};
  }

  // ---- reading the stream
  const uint8_t* take(std::size_t n, std::size_t at, uint8_t op) {
    if (n > size_ - pos_)
      throw_at(at, fmt::format("the pickle ends inside {} (it needs {} more bytes, {} are left)",
                               opcode_name(op), n, size_ - pos_));
    auto p = in_ + pos_;
    pos_ += n;
    return p;
  }
  uint64_t le(const uint8_t* p, std::size_t n) {
    uint64_t x = 0;
    for (std::size_t k = 0; k < n; ++k)
      x |= static_cast<uint64_t>(p[k]) << (8 * k);
    return x;
  }
  uint64_t take_le(std::size_t n, std::size_t at, uint8_t op) { return le(take(n, at, op), n); }

  // ---- making values
  ref make(value v) {
    if (values_.size() + items_total_ >= lim_.max_objects)
      throw_at(v.at, fmt::format("the pickle makes more than {} values (the limit)",
                                 lim_.max_objects));
    values_.push_back(v);
    return static_cast<ref>(values_.size() - 1);
  }
  ref make_scalar(kind k, int64_t i, std::size_t at) {
    value v;
    v.k = k;
    v.i = i;
    v.at = static_cast<uint32_t>(at);
    return make(v);
  }
  ref make_chars(kind k, const uint8_t* p, std::size_t n, std::size_t at) {
    value v;
    v.k = k;
    v.at = static_cast<uint32_t>(at);
    v.a = static_cast<uint32_t>(chars_.size());
    v.b = static_cast<uint32_t>(n);
    chars_.append(reinterpret_cast<const char*>(p), n);
    return make(v);
  }
  ref make_seq(kind k, std::vector<ref> elems, std::size_t at) {
    check_items(elems.size(), at);
    items_total_ += elems.size();
    value v;
    v.k = k;
    v.at = static_cast<uint32_t>(at);
    v.a = static_cast<uint32_t>(seqs_.size());
    seqs_.push_back(std::move(elems));
    return make(v);
  }
  void check_items(std::size_t n, std::size_t at) {
    if (n > lim_.max_items)
      throw_at(at, fmt::format("a container of {} elements exceeds the limit of {}", n,
                               lim_.max_items));
  }
  void add_items(ref target, std::span<const ref> elems, std::size_t at) {
    auto& seq = seqs_[values_[target].a];
    check_items(seq.size() + elems.size(), at);
    if (values_.size() + items_total_ + elems.size() >= lim_.max_objects)
      throw_at(at, fmt::format("the pickle makes more than {} values (the limit)",
                               lim_.max_objects));
    items_total_ += elems.size();
    seq.insert(seq.end(), elems.begin(), elems.end());
  }

  // ---- the stack
  void push(ref r, std::size_t at) {
    if (stack_.size() >= lim_.max_stack)
      throw_at(at, fmt::format("more than {} values on the pickle stack (the limit)",
                               lim_.max_stack));
    stack_.push_back(r);
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  ref pop(std::size_t at, uint8_t op) {
    if (stack_.size() <= floor())
      throw_at(at, fmt::format("{} finds the stack empty", opcode_name(op)));
    auto r = stack_.back();
    stack_.pop_back();
    return r;
  }
  ref top(std::size_t at, uint8_t op) {
    if (stack_.size() <= floor())
      throw_at(at, fmt::format("{} finds the stack empty", opcode_name(op)));
    return stack_.back();
  }
  // The values above the last MARK, which is removed.
  std::vector<ref> pop_mark(std::size_t at, uint8_t op) {
    if (marks_.empty())
      throw_at(at, fmt::format("{} without a MARK before it", opcode_name(op)));
    auto m = marks_.back();
    marks_.pop_back();
    std::vector<ref> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  ref expect(ref r, kind k, std::size_t at, uint8_t op, std::string_view role) {
    if (values_[r].k != k)
      throw_at(at, fmt::format("{} expects {} as {}, got {}", opcode_name(op), kind_phrase(k),
                               role, kind_phrase(values_[r].k)));
    return r;
  }

  // ---- the memo
  void memo_put(uint64_t index, ref r, std::size_t at) {
    if (index >= lim_.max_memo || (memo_.size() >= lim_.max_memo && !memo_.count(index)))
      throw_at(at, fmt::format("memo index {} is past the limit of {} entries", index,
                               lim_.max_memo));
    memo_[static_cast<uint32_t>(index)] = r;
  }
  ref memo_get(uint64_t index, std::size_t at, uint8_t op) {
    auto it = index < lim_.max_memo ? memo_.find(static_cast<uint32_t>(index)) : memo_.end();
    if (it == memo_.end())
      throw_at(at, fmt::format("{} reads memo entry {}, which was never set", opcode_name(op),
                               index));
    return it->second;
  }

  // ---- globals
  ref make_global(std::string_view module, std::string_view name, std::size_t at, uint8_t op) {
    value v;
    v.k = kind::global;
    v.at = static_cast<uint32_t>(at);
    if (module == "torch") {
      for (auto t : k_all_dtypes) {
        if (torch_name(t) == name) {
          v.aux = static_cast<uint8_t>(global_id::dtype_object);
          v.i = static_cast<int64_t>(t);
          break;
        }
      }
    }
    if (v.aux == 0) {
      for (const auto& g : k_globals) {
        if (g.module == module && g.name == name) {
          v.aux = static_cast<uint8_t>(g.id);
          break;
        }
      }
    }
    if (v.aux == 0) {
      std::string hint;
      if (module == "torch.multiprocessing.reductions")
        hint = "; is a tensor of the payload not on a CUDA device? rlserve reads CUDA tensors "
               "shared by IPC only";
      else if (module == "torch" || module.starts_with("torch."))
        hint = "; rlserve reads only CUDA tensors of the dtypes it knows (float32, float16, "
               "bfloat16, float64, int8, uint8, int16, int32, int64, bool)";
      throw_at(at, fmt::format("global {}.{} ({}) is not allowed: rlserve reads only PyTorch's "
                               "CUDA tensors and SGLang's bucket metadata{}",
                               printable(module), printable(name), opcode_name(op), hint));
    }
    std::string full = std::string(module) + "." + std::string(name);
    v.a = static_cast<uint32_t>(chars_.size());
    v.b = static_cast<uint32_t>(full.size());
    chars_ += full;
    return make(v);
  }
  std::string_view read_line(std::size_t at, uint8_t op) {
    // GLOBAL's operands are two '\n'-terminated lines; a module path is far below 256 bytes.
    const std::size_t start = pos_;
    while (pos_ < size_ && in_[pos_] != '\n') {
      if (pos_ - start >= 256)
        throw_at(at, fmt::format("{} operand longer than 256 bytes", opcode_name(op)));
      ++pos_;
    }
    if (pos_ >= size_)
      throw_at(at, fmt::format("the pickle ends inside {}", opcode_name(op)));
    std::string_view line(reinterpret_cast<const char*>(in_ + start), pos_ - start);
    ++pos_;
    return line;
  }

  // ---- one opcode; returns true at STOP
  bool step(uint8_t op, std::size_t at) {
    switch (op) {
      case 0x80: { // PROTO
        auto v = take_le(1, at, op);
        if (v < 2 || v > 5)
          throw_at(at, fmt::format("pickle protocol {}; rlserve reads protocols 2 to 5", v));
        return false;
      }
      case 0x95: { // FRAME: a length hint; framing does not change what the opcodes mean
        auto n = take_le(8, at, op);
        if (n > size_ - pos_)
          throw_at(at, fmt::format("FRAME of {} bytes, but only {} are left (truncated?)", n,
                                   size_ - pos_));
        return false;
      }
      case '.': { // STOP
        if (stack_.size() != 1 || !marks_.empty())
          throw_at(at, fmt::format("STOP with {} values on the stack and {} open MARKs (expected "
                                   "one value)",
                                   stack_.size(), marks_.size()));
        if (pos_ != size_)
          throw_at(at, fmt::format("{} bytes follow STOP", size_ - pos_));
        result_ = stack_.back();
        return true;
      }
      case 0x94: // MEMOIZE
        memo_put(memo_.size(), top(at, op), at);
        return false;
      case 'q': // BINPUT
        memo_put(take_le(1, at, op), top(at, op), at);
        return false;
      case 'r': // LONG_BINPUT
        memo_put(take_le(4, at, op), top(at, op), at);
        return false;
      case 'h': // BINGET
        push(memo_get(take_le(1, at, op), at, op), at);
        return false;
      case 'j': // LONG_BINGET
        push(memo_get(take_le(4, at, op), at, op), at);
        return false;
      case '(': // MARK
        if (marks_.size() >= lim_.max_marks)
          throw_at(at, fmt::format("more than {} nested MARKs (the limit)", lim_.max_marks));
        marks_.push_back(stack_.size());
        return false;
      case ']': push(make_seq(kind::list, {}, at), at); return false;
      case '}': push(make_seq(kind::dict, {}, at), at); return false;
      case ')': push(make_seq(kind::tuple, {}, at), at); return false;
      case 0x85:
      case 0x86:
      case 0x87: { // TUPLE1..3
        std::size_t n = op - 0x84u;
        std::vector<ref> elems(n);
        for (std::size_t k = n; k-- > 0;)
          elems[k] = pop(at, op);
        push(make_seq(kind::tuple, std::move(elems), at), at);
        return false;
      }
      case 't': push(make_seq(kind::tuple, pop_mark(at, op), at), at); return false;
      case 'a': { // APPEND
        auto x = pop(at, op);
        auto list = expect(top(at, op), kind::list, at, op, "the target");
        add_items(list, std::span<const ref>(&x, 1), at);
        return false;
      }
      case 'e': { // APPENDS
        auto elems = pop_mark(at, op);
        auto list = expect(top(at, op), kind::list, at, op, "the target");
        add_items(list, elems, at);
        return false;
      }
      case 's': { // SETITEM
        std::array<ref, 2> kv{};
        kv[1] = pop(at, op);
        kv[0] = expect(pop(at, op), kind::text, at, op, "a key");
        auto dict = expect(top(at, op), kind::dict, at, op, "the target");
        add_items(dict, kv, at);
        return false;
      }
      case 'u': { // SETITEMS
        auto elems = pop_mark(at, op);
        if (elems.size() % 2 != 0)
          throw_at(at, "SETITEMS with an odd number of values (a key without its value)");
        for (std::size_t k = 0; k < elems.size(); k += 2)
          expect(elems[k], kind::text, at, op, "a key");
        auto dict = expect(top(at, op), kind::dict, at, op, "the target");
        add_items(dict, elems, at);
        return false;
      }
      case 0x8c:
      case 'X': { // SHORT_BINUNICODE, BINUNICODE
        auto n = take_le(op == 'X' ? 4 : 1, at, op);
        if (n > lim_.max_text)
          throw_at(at, fmt::format("{} of {} bytes exceeds the limit of {}", opcode_name(op), n,
                                   lim_.max_text));
        auto p = take(n, at, op);
        if (!valid_utf8({reinterpret_cast<const char*>(p), n}))
          throw_at(at, fmt::format("{} is not valid UTF-8", opcode_name(op)));
        push(make_chars(kind::text, p, n, at), at);
        return false;
      }
      case 'C':
      case 'B': { // SHORT_BINBYTES, BINBYTES
        auto n = take_le(op == 'B' ? 4 : 1, at, op);
        if (n > lim_.max_text)
          throw_at(at, fmt::format("{} of {} bytes exceeds the limit of {}", opcode_name(op), n,
                                   lim_.max_text));
        auto p = take(n, at, op);
        push(make_chars(kind::bytes, p, n, at), at);
        return false;
      }
      case 'J': // BININT: signed 32-bit
        push(make_scalar(kind::integer, static_cast<int32_t>(take_le(4, at, op)), at), at);
        return false;
      case 'K':
        push(make_scalar(kind::integer, static_cast<int64_t>(take_le(1, at, op)), at), at);
        return false;
      case 'M':
        push(make_scalar(kind::integer, static_cast<int64_t>(take_le(2, at, op)), at), at);
        return false;
      case 0x8a: { // LONG1: n bytes of little-endian two's complement
        auto n = take_le(1, at, op);
        if (n > 8)
          throw_at(at, fmt::format("LONG1 of {} bytes is wider than 64 bits", n));
        auto x = take_le(n, at, op);
        if (n > 0 && n < 8 && (x >> (8 * n - 1)) & 1)
          x |= ~uint64_t{0} << (8 * n); // sign-extend
        push(make_scalar(kind::integer, static_cast<int64_t>(x), at), at);
        return false;
      }
      case 'N': push(make_scalar(kind::none, 0, at), at); return false;
      case 0x88: push(make_scalar(kind::boolean, 1, at), at); return false;
      case 0x89: push(make_scalar(kind::boolean, 0, at), at); return false;
      case 0x93: { // STACK_GLOBAL
        auto name = expect(pop(at, op), kind::text, at, op, "the name");
        auto module = expect(pop(at, op), kind::text, at, op, "the module");
        push(make_global(chars(values_[module]), chars(values_[name]), at, op), at);
        return false;
      }
      case 'c': { // GLOBAL
        auto module = std::string(read_line(at, op));
        auto name = read_line(at, op);
        push(make_global(module, name, at, op), at);
        return false;
      }
      case 'R': { // REDUCE: recorded, never called
        auto args = expect(pop(at, op), kind::tuple, at, op, "the arguments");
        auto fn = expect(pop(at, op), kind::global, at, op, "the callable");
        auto id = static_cast<global_id>(values_[fn].aux);
        if (id == global_id::size_class) {
          // torch.Size((d0, d1, ...)): one argument, a tuple of ints.
          const auto& a = seqs_[values_[args].a];
          if (a.size() != 1 || values_[a[0]].k != kind::tuple)
            throw_at(at, "torch.Size expects one tuple of ints");
          auto dims = seqs_[values_[a[0]].a];
          for (auto d : dims)
            if (values_[d].k != kind::integer)
              throw_at(at, fmt::format("torch.Size expects ints, got {}",
                                       kind_phrase(values_[d].k)));
          push(make_seq(kind::size, std::move(dims), at), at);
          return false;
        }
        if (id == global_id::rebuild_cuda_tensor || id == global_id::rebuild_cuda_tensor_sglang) {
          value v;
          v.k = kind::tensor;
          v.aux = values_[fn].aux;
          v.at = static_cast<uint32_t>(at);
          v.a = args;
          push(make(v), at);
          return false;
        }
        throw_at(at, fmt::format("REDUCE calls {}, which rlserve does not call",
                                 chars(values_[fn])));
      }
      case 0x81: { // NEWOBJ: only FlattenedTensorMetadata(), whose fields BUILD then sets
        auto args = expect(pop(at, op), kind::tuple, at, op, "the arguments");
        auto cls = expect(pop(at, op), kind::global, at, op, "the class");
        if (static_cast<global_id>(values_[cls].aux) != global_id::metadata_class)
          throw_at(at, fmt::format("NEWOBJ makes {}, which rlserve does not make",
                                   chars(values_[cls])));
        if (!seqs_[values_[args].a].empty())
          throw_at(at, "NEWOBJ of FlattenedTensorMetadata with arguments (expected none)");
        value v;
        v.k = kind::instance;
        v.at = static_cast<uint32_t>(at);
        v.a = no_ref;
        push(make(v), at);
        return false;
      }
      case 'b': { // BUILD: the state dict of a FlattenedTensorMetadata
        auto state = expect(pop(at, op), kind::dict, at, op, "the state");
        auto obj = expect(top(at, op), kind::instance, at, op, "the target");
        if (values_[obj].a != no_ref)
          throw_at(at, "BUILD of an object that was already built");
        values_[obj].a = state;
        return false;
      }
      default: {
        auto info = find_opcode(op);
        if (info)
          throw_at(at, fmt::format("opcode {} (0x{:02x}) is not accepted: rlserve reads only the "
                                   "opcodes PyTorch writes for CUDA tensors",
                                   info->name, op));
        throw_at(at, fmt::format("unknown opcode 0x{:02x}", op));
      }
    }
  }

  const uint8_t* in_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const torch_pickle_limits& lim_;
  std::vector<value> values_;
  std::vector<std::vector<ref>> seqs_;
  std::size_t items_total_ = 0;
  std::string chars_;
  std::vector<ref> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint32_t, ref> memo_;
  ref result_ = no_ref;
};

// ---- pass 2: the schema -------------------------------------------------------------------------

constexpr std::array<std::string_view, 15> k_rebuild_args{
  "tensor_cls",         "tensor_size",          "tensor_stride", "tensor_offset",
  "storage_cls",        "dtype",                "storage_device", "storage_handle",
  "storage_size_bytes", "storage_offset_bytes", "requires_grad", "ref_counter_handle",
  "ref_counter_offset", "event_handle",         "event_sync_required"};

std::string dims_text(const std::vector<int64_t>& d) {
  std::string out = "[";
  for (std::size_t i = 0; i < d.size(); ++i)
    out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}

// One pickled tensor, checked.
struct tensor_view {
  bool empty = false; // no storage: nothing to read, nothing to decrement
  int64_t numel = 0;
  DeviceTensorRef ref;
};

class interpreter {
public:
  interpreter(const machine& m, const torch_pickle_limits& limits) : m_(m), lim_(limits) {}

  expected<std::vector<NamedDeviceTensor>> named_list(ref root) {
    const auto& v = m_.at(root);
    if (v.k != kind::list)
      return fail(fmt::format("the pickle holds {}; expected a list of (name, tensor) tuples "
                              "(load_format absent or \"direct\"; a bucket needs load_format "
                              "\"flattened_bucket\")",
                              kind_phrase(v.k)));
    std::vector<NamedDeviceTensor> out;
    const auto& elems = m_.items(v);
    for (std::size_t i = 0; i < elems.size(); ++i) {
      const auto& e = m_.at(elems[i]);
      const auto& pair = e.k == kind::tuple ? m_.items(e) : no_items_;
      if (e.k != kind::tuple || pair.size() != 2 || m_.at(pair[0]).k != kind::text)
        return fail(fmt::format("element {} of the list is {}; expected a (name, tensor) tuple",
                                i, e.k == kind::tuple ? "a tuple of another form"
                                                      : std::string(kind_phrase(e.k))));
      std::string name(m_.chars(m_.at(pair[0])));
      if (name.empty())
        return fail(fmt::format("element {} of the list has an empty name", i));
      auto t = tensor(pair[1], "tensor \"" + printable(name) + "\"");
      if (!t)
        return std::move(t).take_failure();
      if (t->empty)
        continue;
      if (out.size() >= lim_.max_tensors)
        return fail(fmt::format("more than {} tensors (the limit)", lim_.max_tensors));
      out.push_back(NamedDeviceTensor{std::move(name), std::move(t->ref)});
    }
    return out;
  }

  expected<std::vector<NamedDeviceTensor>> bucket(ref root) {
    const auto& v = m_.at(root);
    if (v.k != kind::dict)
      return fail(fmt::format("the pickle holds {}; expected a dict {{\"flattened_tensor\", "
                              "\"metadata\"}} (load_format \"flattened_bucket\"; a list of "
                              "(name, tensor) tuples needs load_format absent or \"direct\")",
                              kind_phrase(v.k)));
    ref flat_ref = no_ref, meta_ref = no_ref;
    const auto& kv = m_.items(v);
    for (std::size_t k = 0; k < kv.size(); k += 2) {
      auto key = m_.chars(m_.at(kv[k]));
      if (key == "flattened_tensor")
        flat_ref = kv[k + 1];
      else if (key == "metadata")
        meta_ref = kv[k + 1];
      else
        return fail(fmt::format("the bucket has a key \"{}\"; expected only \"flattened_tensor\" "
                                "and \"metadata\"",
                                printable(key)));
    }
    if (flat_ref == no_ref || meta_ref == no_ref)
      return fail(fmt::format("the bucket has no \"{}\"",
                              flat_ref == no_ref ? "flattened_tensor" : "metadata"));
    auto flat = tensor(flat_ref, "flattened_tensor");
    if (!flat)
      return std::move(flat).take_failure();
    const auto& mv = m_.at(meta_ref);
    if (mv.k != kind::list)
      return fail(fmt::format("metadata is {}; expected a list of FlattenedTensorMetadata",
                              kind_phrase(mv.k)));
    const auto& metas = m_.items(mv);
    if (flat->empty) {
      if (!metas.empty())
        return fail(fmt::format("flattened_tensor is empty but metadata describes {} tensors",
                                metas.size()));
      return std::vector<NamedDeviceTensor>{}; // the empty filler bucket
    }
    if (metas.empty())
      return fail(fmt::format("flattened_tensor holds {} bytes but metadata describes no tensor",
                              flat->ref.nbytes));
    if (metas.size() > lim_.max_tensors)
      return fail(fmt::format("metadata describes {} tensors, more than the limit of {}",
                              metas.size(), lim_.max_tensors));
    const auto flat_item = static_cast<int64_t>(element_size(flat->ref.type));
    std::vector<NamedDeviceTensor> out;
    out.reserve(metas.size());
    for (std::size_t i = 0; i < metas.size(); ++i) {
      auto entry = metadata(metas[i], i);
      if (!entry)
        return std::move(entry).take_failure();
      auto& [name, type, shape, start, end, numel] = *entry;
      const std::string label = fmt::format("metadata[{}] (\"{}\")", i, printable(name));
      if (start > end || end > flat->numel)
        return fail(fmt::format("{}: start_idx {} .. end_idx {} is outside flattened_tensor's {} "
                                "elements",
                                label, start, end, flat->numel));
      if (numel != end - start)
        return fail(fmt::format("{}: numel {} differs from end_idx - start_idx = {}", label,
                                numel, end - start));
      auto count = checked_numel(shape);
      const auto item = static_cast<int64_t>(element_size(type));
      const __int128 span_bytes = static_cast<__int128>(end - start) * flat_item;
      const __int128 need = count ? static_cast<__int128>(*count) * item : -1;
      if (need != span_bytes)
        return fail(fmt::format("{}: shape {} of {} needs {} bytes, but start_idx..end_idx spans "
                                "{} bytes of flattened_tensor ({})",
                                label, dims_text(shape), torch_name(type),
                                need >= 0 && need <= INT64_MAX
                                  ? std::to_string(static_cast<int64_t>(need))
                                  : std::string("more than 2^63"),
                                static_cast<int64_t>(span_bytes), torch_name(flat->ref.type)));
      DeviceTensorRef r = flat->ref;
      r.type = type;
      r.shape = shape;
      r.offset = flat->ref.offset + static_cast<uint64_t>(start * flat_item);
      r.nbytes = static_cast<uint64_t>(*count * item);
      if (i > 0) { // one pickled tensor, one decrement: the first ref carries it
        r.ref_counter_handle.clear();
        r.ref_counter_offset = 0;
      }
      out.push_back(NamedDeviceTensor{name, std::move(r)});
    }
    return out;
  }

private:
  struct meta_entry {
    std::string name;
    dtype type;
    std::vector<int64_t> shape;
    int64_t start, end, numel;
  };

  static std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
    __int128 n = 1;
    for (auto d : shape) {
      n *= d;
      if (n > INT64_MAX)
        return std::nullopt;
    }
    return static_cast<int64_t>(n);
  }

  // Dimensions of a torch.Size (or a plain tuple) of non-negative ints.
  expected<std::vector<int64_t>> dims(ref r, std::string_view what) {
    const auto& v = m_.at(r);
    if (v.k != kind::size && v.k != kind::tuple)
      return fail(fmt::format("{} is {}; expected a tuple of ints", what, kind_phrase(v.k)));
    std::vector<int64_t> out;
    for (auto d : m_.items(v)) {
      const auto& x = m_.at(d);
      if (x.k != kind::integer || x.i < 0)
        return fail(fmt::format("{} holds {}; expected non-negative ints", what,
                                x.k == kind::integer ? fmt::format("{}", x.i)
                                                     : std::string(kind_phrase(x.k))));
      out.push_back(x.i);
    }
    return out;
  }

  expected<tensor_view> tensor(ref r, const std::string& label) {
    const auto& v = m_.at(r);
    if (v.k != kind::tensor)
      return fail(fmt::format("{} is {}; expected a CUDA tensor pickled by PyTorch's "
                              "multiprocessing reduction",
                              label, kind_phrase(v.k)));
    const auto fn = static_cast<global_id>(v.aux);
    const std::string_view fn_name =
      fn == global_id::rebuild_cuda_tensor ? "rebuild_cuda_tensor" : "_rebuild_cuda_tensor_modified";
    const auto& args = m_.items(m_.at(v.a));
    const std::string where = fmt::format("{} (pickled at byte {})", label, v.at);
    if (args.size() != k_rebuild_args.size())
      return fail(fmt::format("{}: {} has {} arguments; expected {}", where, fn_name, args.size(),
                              k_rebuild_args.size()));
    auto bad = [&](std::size_t i, std::string_view expected_what) {
      return fail(fmt::format("{}: argument {} ({}) of {} is {}; expected {}", where, i,
                              k_rebuild_args[i], fn_name, kind_phrase(m_.at(args[i]).k),
                              expected_what));
    };
    auto is = [&](std::size_t i, kind k) { return m_.at(args[i]).k == k; };
    auto global_is = [&](std::size_t i, std::initializer_list<global_id> ids) {
      if (!is(i, kind::global))
        return false;
      for (auto id : ids)
        if (static_cast<global_id>(m_.at(args[i]).aux) == id)
          return true;
      return false;
    };
    auto count = [&](std::size_t i) -> std::optional<int64_t> {
      if (!is(i, kind::integer) || m_.at(args[i]).i < 0)
        return std::nullopt;
      return m_.at(args[i]).i;
    };

    if (!global_is(0, {global_id::tensor_class, global_id::parameter_class}))
      return bad(0, "torch.Tensor or torch.nn.parameter.Parameter");
    auto shape = dims(args[1], where + ": tensor_size");
    if (!shape)
      return std::move(shape).take_failure();
    auto stride = dims(args[2], where + ": tensor_stride");
    if (!stride)
      return std::move(stride).take_failure();
    auto tensor_offset = count(3);
    if (!tensor_offset)
      return bad(3, "a non-negative int");
    if (!global_is(4, {global_id::storage_class}))
      return bad(4, "torch.storage.TypedStorage or UntypedStorage");
    if (!global_is(5, {global_id::dtype_object}))
      return bad(5, "a torch dtype");
    const auto type = static_cast<dtype>(m_.at(args[5]).i);
    const auto item = static_cast<int64_t>(element_size(type));

    tensor_view out;
    auto& t = out.ref;
    t.type = type;
    if (is(6, kind::integer)) {
      const auto d = m_.at(args[6]).i;
      if (d < 0 || d > INT32_MAX)
        return fail(fmt::format("{}: storage_device {} is not a device index", where, d));
      t.device = static_cast<int32_t>(d);
    } else if (is(6, kind::text)) {
      auto uuid = normalize_device_uuid(m_.chars(m_.at(args[6])));
      if (!uuid)
        return fail(fmt::format("{}: storage_device: {}", where, uuid.error()));
      t.device_uuid = std::move(*uuid);
    } else {
      return bad(6, "an int (device index) or a str (device UUID)");
    }
    if (!is(7, kind::bytes) && !is(7, kind::none))
      return bad(7, "bytes or None");
    auto storage_size = count(8);
    if (!storage_size)
      return bad(8, "a non-negative int");
    auto storage_offset = count(9);
    if (!storage_offset)
      return bad(9, "a non-negative int");
    if (!is(10, kind::boolean))
      return bad(10, "a bool");
    if (!is(11, kind::bytes) && !is(11, kind::text) && !is(11, kind::none))
      return bad(11, "bytes or None");
    auto rc_offset = count(12);
    if (!rc_offset)
      return bad(12, "a non-negative int");
    if (!is(13, kind::bytes) && !is(13, kind::none))
      return bad(13, "bytes or None");
    if (!is(14, kind::boolean) && !is(14, kind::none))
      return bad(14, "a bool or None");

    if (stride->size() != shape->size())
      return fail(fmt::format("{}: {} strides for a shape of {} dimensions", where,
                              stride->size(), shape->size()));
    auto numel = checked_numel(*shape);
    if (!numel || static_cast<__int128>(*numel) * item > INT64_MAX)
      return fail(fmt::format("{}: shape {} overflows int64 bytes", where, dims_text(*shape)));
    out.numel = *numel;
    t.shape = std::move(*shape);

    // The storage-less form (torch shares no memory for an empty storage): nothing to read.
    if (is(7, kind::none) || *storage_size == 0) {
      if (*numel != 0)
        return fail(fmt::format("{}: {} elements but no storage (storage_handle None or "
                                "storage_size_bytes 0)",
                                where, *numel));
      out.empty = true;
      return out;
    }

    // rlserve copies each tensor as one byte range: it must be C-contiguous. Dimensions of
    // size 1 may carry any stride (PyTorch's own contiguity rule).
    if (*numel > 0) {
      int64_t want = 1;
      std::vector<int64_t> expected_strides(t.shape.size());
      bool contiguous = true;
      for (std::size_t k = t.shape.size(); k-- > 0;) {
        expected_strides[k] = want;
        if (t.shape[k] != 1 && (*stride)[k] != want)
          contiguous = false;
        want *= t.shape[k];
      }
      if (!contiguous)
        return fail(fmt::format("{}: strides {} of shape {} are not contiguous (expected {}); "
                                "call .contiguous() on the tensor before sending it",
                                where, dims_text(*stride), dims_text(t.shape),
                                dims_text(expected_strides)));
    }

    const auto handle = m_.chars(m_.at(args[7]));
    t.ipc_handle.assign(handle.begin(), handle.end());
    if (auto ok = check_ipc_handle(t.ipc_handle); !ok)
      return fail(fmt::format("{}: storage_handle: {}", where, ok.error()));

    // The tensor must lie inside the storage the handle and offsets name.
    const __int128 first = static_cast<__int128>(*tensor_offset) * item;
    const __int128 last = first + static_cast<__int128>(*numel) * item;
    if (last > *storage_size)
      return fail(fmt::format("{}: elements {}..{} of {} end at byte {}, past the storage's {} "
                              "bytes",
                              where, *tensor_offset, *tensor_offset + *numel, torch_name(type),
                              static_cast<int64_t>(last), *storage_size));
    if (static_cast<__int128>(*storage_offset) + *storage_size > INT64_MAX)
      return fail(fmt::format("{}: storage_offset_bytes {} + storage_size_bytes {} overflow int64",
                              where, *storage_offset, *storage_size));
    t.offset = static_cast<uint64_t>(*storage_offset) + static_cast<uint64_t>(first);
    t.nbytes = static_cast<uint64_t>(*numel * item);

    if (!is(11, kind::none)) {
      t.ref_counter_handle = std::string(m_.chars(m_.at(args[11])));
      if (auto ok = check_ref_counter_handle(t.ref_counter_handle); !ok)
        return fail(fmt::format("{}: ref_counter_handle: {}", where, ok.error()));
      t.ref_counter_offset = static_cast<uint64_t>(*rc_offset);
    }
    if (!is(13, kind::none)) {
      const auto ev = m_.chars(m_.at(args[13]));
      if (ev.size() != 64)
        return fail(fmt::format("{}: event_handle has {} bytes; a cudaIpcEventHandle_t has 64",
                                where, ev.size()));
      t.event_handle.assign(ev.begin(), ev.end());
    }
    t.event_sync_required = is(14, kind::boolean) && m_.at(args[14]).i != 0;
    if (t.event_sync_required && t.event_handle.empty())
      return fail(fmt::format("{}: event_sync_required is True but event_handle is None", where));
    return out;
  }

  expected<meta_entry> metadata(ref r, std::size_t i) {
    const auto& v = m_.at(r);
    const std::string label = fmt::format("metadata[{}]", i);
    if (v.k != kind::instance || v.a == no_ref)
      return fail(fmt::format("{} is {}; expected a FlattenedTensorMetadata", label,
                              v.k == kind::instance ? "an object without fields"
                                                    : std::string(kind_phrase(v.k))));
    const auto& state = m_.items(m_.at(v.a));
    // Later keys win, as in Python; the dataclass has six fields.
    constexpr std::array<std::string_view, 6> names{"name",    "shape",   "dtype",
                                                    "start_idx", "end_idx", "numel"};
    std::array<ref, 6> found;
    found.fill(no_ref);
    if (state.size() > 2 * 32)
      return fail(fmt::format("{} has {} fields; FlattenedTensorMetadata has 6", label,
                              state.size() / 2));
    for (std::size_t k = 0; k < state.size(); k += 2) {
      auto key = m_.chars(m_.at(state[k]));
      for (std::size_t f = 0; f < names.size(); ++f)
        if (key == names[f])
          found[f] = state[k + 1];
    }
    for (std::size_t f = 0; f < names.size(); ++f)
      if (found[f] == no_ref)
        return fail(fmt::format("{} has no field {}", label, names[f]));
    const auto& name = m_.at(found[0]);
    if (name.k != kind::text || name.b == 0)
      return fail(fmt::format("{}.name is {}; expected a non-empty str", label,
                              name.k == kind::text ? "empty" : std::string(kind_phrase(name.k))));
    meta_entry e;
    e.name = std::string(m_.chars(name));
    const std::string named = fmt::format("{} (\"{}\")", label, printable(e.name));
    auto shape = dims(found[1], named + ".shape");
    if (!shape)
      return std::move(shape).take_failure();
    e.shape = std::move(*shape);
    const auto& dt = m_.at(found[2]);
    if (dt.k != kind::global || static_cast<global_id>(dt.aux) != global_id::dtype_object)
      return fail(fmt::format("{}.dtype is {}; expected a torch dtype", named, kind_phrase(dt.k)));
    e.type = static_cast<dtype>(dt.i);
    int64_t* ints[3] = {&e.start, &e.end, &e.numel};
    for (std::size_t f = 3; f < 6; ++f) {
      const auto& x = m_.at(found[f]);
      if (x.k != kind::integer || x.i < 0)
        return fail(fmt::format("{}.{} is {}; expected a non-negative int", named, names[f],
                                x.k == kind::integer ? fmt::format("{}", x.i)
                                                     : std::string(kind_phrase(x.k))));
      *ints[f - 3] = x.i;
    }
    return e;
  }

  const machine& m_;
  const torch_pickle_limits& lim_;
  const std::vector<ref> no_items_;
};

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

} // namespace

expected<std::vector<NamedDeviceTensor>> read_torch_ipc_pickle(std::span<const std::byte> pickle,
                                                              torch_pickle_form form,
                                                              const torch_pickle_limits& limits) {
  machine m(pickle, limits);
  auto root = m.run();
  if (!root)
    return std::move(root).take_failure();
  interpreter in(m, limits);
  return form == torch_pickle_form::flattened_bucket ? in.bucket(*root) : in.named_list(*root);
}

std::span<const std::string_view> torch_pickle_opcodes() {
  static const auto names = [] {
    std::vector<std::string_view> out;
    for (const auto& op : k_opcodes)
      if (op.accepted)
        out.push_back(op.name);
    return out;
  }();
  return names;
}

std::vector<std::string> torch_pickle_globals() {
  std::vector<std::string> out;
  for (const auto& g : k_globals)
    if (g.id != global_id::dtype_object)
      out.push_back(std::string(g.module) + "." + std::string(g.name));
  for (auto t : k_all_dtypes)
    out.push_back("torch." + std::string(torch_name(t)));
  return out;
}

status check_ipc_handle(std::span<const uint8_t> h) {
  // A raw cudaIpcMemHandle_t, as older PyTorch and other producers send it.
  if (h.size() == 64)
    return {};
  // PyTorch's shareable handle: version byte, type byte, payload.
  if (h.size() >= 2 && h[1] == 'e')
    return fail("this handle is an expandable segment (type 'e'), which CUDA IPC cannot open; "
                "unset expandable_segments in PYTORCH_CUDA_ALLOC_CONF on the trainer");
  if (h.size() != 66)
    return fail(fmt::format("{} bytes; expected 64 (cudaIpcMemHandle_t) or 66 (PyTorch's "
                            "version, type 'c', then the 64-byte handle)",
                            h.size()));
  if (h[0] != 2 && h[0] != 3)
    return fail(fmt::format("handle version {}; rlserve reads versions 2 and 3", h[0]));
  if (h[1] != 'c')
    return fail(fmt::format("handle type 0x{:02x}; rlserve reads type 'c' (cudaMalloc memory)",
                            h[1]));
  return {};
}

expected<std::string> normalize_device_uuid(std::string_view text) {
  std::string_view body = text;
  if (body.starts_with("GPU-"))
    body.remove_prefix(4);
  // 8-4-4-4-12 hex digits, as Python's uuid.UUID prints and nvidia-smi shows after "GPU-".
  bool ok = body.size() == 36;
  for (std::size_t i = 0; ok && i < body.size(); ++i)
    ok = (i == 8 || i == 13 || i == 18 || i == 23) ? body[i] == '-' : is_hex(body[i]);
  if (!ok)
    return fail(fmt::format("\"{}\" is not a GPU UUID (expected xxxxxxxx-xxxx-xxxx-xxxx-"
                            "xxxxxxxxxxxx in hex, with or without \"GPU-\")",
                            printable(text)));
  std::string out = "GPU-";
  for (char c : body)
    out += (c >= 'A' && c <= 'F') ? static_cast<char>(c - 'A' + 'a') : c;
  return out;
}

status check_ref_counter_handle(std::string_view name) {
  bool ok = name.size() >= 2 && name.size() <= 251 && name[0] == '/' && name[1] != '.';
  for (std::size_t i = 1; ok && i < name.size(); ++i) {
    char c = name[i];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
  }
  if (!ok)
    return fail(fmt::format("\"{}\" is not a shared-memory name like PyTorch's "
                            "\"/torch_<pid>_<n>_<n>\" (a '/', then letters, digits, '_', '.', '-')",
                            printable(name)));
  return {};
}

} // namespace rlserve
