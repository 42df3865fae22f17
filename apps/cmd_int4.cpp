// `rlserve int4` (hidden): the INT4 kernels on .npy files, for tests/python/test_int4_formats.py,
// which re-implements the recipes and the packing in numpy and compares bytes.
//
//   rlserve int4 quantize --in W.npy --recipe int4-asym --group-size 128 [--zp-layout miles]
//                         [--serving] [--name NAME] --out DIR
//       W.npy: bf16 bits as uint16 (or float32, rounded to bf16), [n, k] or [experts, n, k].
//       Writes DIR/weight_packed.npy (int32), weight_scale.npy (uint16 = bf16 bits),
//       weight_zero_point.npy (int32, asymmetric), weight_shape.npy (int64 [2]); with --serving
//       also serving_weight.npy, serving_scale.npy, serving_zero_point.npy from the fused path.
//   rlserve int4 roundtrip --in DIR --group-size 128 [--zp-layout auto|standard|miles]
//                          [--scale-dtype bf16|f16] [--name NAME] --out DIR2
//       Reads a load-format module from DIR (zero points optional: absent = symmetric), repacks it
//       to the serving layout and restores it. Writes serving_*.npy, the restored weight_*.npy,
//       and dequant_load.npy / dequant_serving.npy (bf16 bits [.., n, k]) from the two reference
//       dequantizers.
// Both print one JSON line describing what they did; errors go to stderr with exit code 1.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/command.hpp"
#include "kernels/bf16.hpp"
#include "kernels/compressed_tensors.hpp"
#include "kernels/int4_quant.hpp"
#include "kernels/serving_layout.hpp"

namespace rlserve::apps {

namespace {

namespace k4 = rlserve::kernels;

// ---- .npy (format versions 1.0-3.0, little-endian, C order) -------------------------------------

struct npy_array {
  std::string descr; // "<u2", "<i4", "<f4", "<i8", "<f2"
  std::vector<int64_t> shape;
  std::vector<char> data;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape)
      n *= d;
    return n;
  }
  template <class T>
  std::vector<T> as() const {
    std::vector<T> out(data.size() / sizeof(T));
    std::memcpy(out.data(), data.data(), out.size() * sizeof(T));
    return out;
  }
};

std::size_t descr_size(const std::string& d) {
  if (d == "<u2" || d == "<i2" || d == "<f2")
    return 2;
  if (d == "<i4" || d == "<u4" || d == "<f4")
    return 4;
  if (d == "<i8" || d == "<u8" || d == "<f8")
    return 8;
  if (d == "|u1" || d == "|i1")
    return 1;
  return 0;
}

// Value of `key` in the header dict text: the characters after "'key':" up to the matching end.
std::string header_field(const std::string& header, const std::string& key, const std::string& path) {
  auto at = header.find("'" + key + "'");
  if (at == std::string::npos)
    throw command_failed(fmt::format("{}: .npy header has no '{}'", path, key));
  at = header.find(':', at) + 1;
  while (at < header.size() && header[at] == ' ')
    ++at;
  if (header[at] == '\'') {
    auto end = header.find('\'', at + 1);
    return header.substr(at + 1, end - at - 1);
  }
  if (header[at] == '(') {
    auto end = header.find(')', at);
    return header.substr(at + 1, end - at - 1);
  }
  auto end = header.find_first_of(",}", at);
  return header.substr(at, end - at);
}

npy_array read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw command_failed(fmt::format("{}: cannot open", path));
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw command_failed(fmt::format("{}: not a .npy file", path));
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len))
    throw command_failed(fmt::format("{}: truncated .npy header", path));
  npy_array a;
  a.descr = header_field(header, "descr", path);
  if (header_field(header, "fortran_order", path) != "False")
    throw command_failed(fmt::format("{}: Fortran-order arrays are not supported", path));
  const std::string dims = header_field(header, "shape", path);
  std::size_t i = 0;
  while (i < dims.size()) {
    if (dims[i] == ',' || dims[i] == ' ') {
      ++i;
      continue;
    }
    std::size_t used = 0;
    a.shape.push_back(std::stoll(dims.substr(i), &used));
    i += used;
  }
  const std::size_t esize = descr_size(a.descr);
  if (esize == 0)
    throw command_failed(fmt::format("{}: unsupported dtype '{}'", path, a.descr));
  a.data.resize(static_cast<std::size_t>(a.numel()) * esize);
  if (!f.read(a.data.data(), static_cast<std::streamsize>(a.data.size())))
    throw command_failed(fmt::format("{}: data shorter than its shape says", path));
  return a;
}

void write_npy(const std::filesystem::path& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, std::size_t bytes) {
  std::string dims;
  for (auto d : shape)
    dims += std::to_string(d) + ", ";
  if (shape.size() > 1)
    dims.resize(dims.size() - 2);
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f)
    throw command_failed(fmt::format("{}: cannot write", path.string()));
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                 static_cast<unsigned char>(header.size() & 0xff),
                                 static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(pre), 10);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f)
    throw command_failed(fmt::format("{}: write failed", path.string()));
}

template <class T>
void write_vec(const std::filesystem::path& dir, const char* name, const std::string& descr,
               const std::vector<int64_t>& shape, const std::vector<T>& v) {
  write_npy(dir / name, descr, shape, v.data(), v.size() * sizeof(T));
}

// Leading experts dimension (if the input had one) followed by `rest`.
std::vector<int64_t> dims(const k4::int4_shape& s, bool batched, std::vector<int64_t> rest) {
  if (batched)
    rest.insert(rest.begin(), s.batch);
  return rest;
}

// ---- int4 quantize ------------------------------------------------------------------------------

struct quantize_options {
  std::string in, out, recipe = "int4-asym", zp_layout = "standard", name = "weight";
  int32_t group_size = 128;
  bool serving = false;
};

void run_quantize(const quantize_options& o) {
  auto recipe = k4::parse_int4_recipe(o.recipe);
  if (!recipe)
    throw command_failed(fmt::format("--recipe {}: use int4-sym-qat, int4-sym or int4-asym", o.recipe));
  auto layout = k4::parse_zero_point_layout(o.zp_layout);
  if (!layout)
    throw command_failed(fmt::format("--zp-layout {}: use standard or miles", o.zp_layout));
  auto w = read_npy(o.in);
  if (w.shape.size() != 2 && w.shape.size() != 3)
    throw command_failed(fmt::format("{}: expected [n, k] or [experts, n, k], got {} dimensions", o.in,
                                     w.shape.size()));
  std::vector<uint16_t> bits;
  if (w.descr == "<u2") {
    bits = w.as<uint16_t>();
  } else if (w.descr == "<f4") {
    for (float v : w.as<float>())
      bits.push_back(k4::float_to_bf16(v));
  } else {
    throw command_failed(fmt::format("{}: dtype '{}': give bf16 bits as uint16, or float32", o.in, w.descr));
  }
  const bool batched = w.shape.size() == 3;
  k4::int4_shape s;
  s.batch = batched ? w.shape[0] : 1;
  s.n = w.shape[w.shape.size() - 2];
  s.k = w.shape.back();
  s.group_size = o.group_size;
  const bool asym = *recipe == k4::int4_recipe::asym;

  // Shape problems first, so the message names the check rather than an allocation size.
  if (auto m = k4::int4_check_load_shape(s, asym); !m.empty())
    throw command_failed(k4::int4_shape_message(o.name, std::string(k4::to_string(*recipe)) + " quantization", m));
  std::vector<int32_t> packed(k4::ct_weight_packed_words(s)), zp(asym ? k4::ct_zero_point_words(s) : 0);
  std::vector<uint16_t> scale(k4::ct_scale_count(s));
  k4::int4_quant_args a;
  a.shape = s;
  a.recipe = *recipe;
  a.zp_layout = *layout;
  a.w = bits.data();
  a.weight_packed = packed.data();
  a.weight_scale = scale.data();
  a.weight_zero_point = asym ? zp.data() : nullptr;
  if (auto st = k4::int4_quantize(a, o.name); !st)
    throw command_failed(st.error());

  std::filesystem::create_directories(o.out);
  const std::filesystem::path dir = o.out;
  const int64_t groups = k4::int4_groups(s);
  write_vec(dir, "weight_packed.npy", "<i4", dims(s, batched, {s.n, s.k / 8}), packed);
  write_vec(dir, "weight_scale.npy", "<u2", dims(s, batched, {s.n, groups}), scale);
  if (asym)
    write_vec(dir, "weight_zero_point.npy", "<i4",
              dims(s, batched, *layout == k4::zero_point_layout::standard ? std::vector<int64_t>{s.n / 8, groups}
                                                                          : std::vector<int64_t>{groups, s.n / 8}),
              zp);
  std::vector<int64_t> weight_shape = {s.n, s.k};
  write_vec(dir, "weight_shape.npy", "<i8", {2}, weight_shape);

  if (o.serving) {
    std::vector<int32_t> sw, sz;
    std::vector<uint16_t> ss;
    if (auto m = k4::int4_check_serving_shape(s); !m.empty())
      throw command_failed(k4::int4_shape_message(o.name, "serving layout", m));
    sw.resize(k4::serving_weight_words(s));
    ss.resize(k4::serving_scale_count(s));
    sz.resize(asym ? k4::serving_zero_point_words(s) : 0);
    k4::int4_quant_serving_args f;
    f.shape = s;
    f.recipe = *recipe;
    f.w = bits.data();
    f.serving_weight = sw.data();
    f.serving_scale = ss.data();
    f.serving_zero_point = asym ? sz.data() : nullptr;
    if (auto st = k4::int4_quantize_serving(f, o.name); !st)
      throw command_failed(st.error());
    write_vec(dir, "serving_weight.npy", "<i4", dims(s, batched, {s.k / 16, 2 * s.n}), sw);
    write_vec(dir, "serving_scale.npy", "<u2", dims(s, batched, {groups, s.n}), ss);
    if (asym)
      write_vec(dir, "serving_zero_point.npy", "<i4", dims(s, batched, {groups, s.n / 8}), sz);
  }
  std::printf("{\"recipe\": \"%s\", \"batch\": %lld, \"n\": %lld, \"k\": %lld, \"group_size\": %d, "
              "\"zero_point_layout\": \"%s\", \"serving\": %s}\n",
              std::string(k4::to_string(*recipe)).c_str(), static_cast<long long>(s.batch),
              static_cast<long long>(s.n), static_cast<long long>(s.k), s.group_size,
              asym ? std::string(k4::to_string(*layout)).c_str() : "none", o.serving ? "true" : "false");
}

// ---- int4 roundtrip -----------------------------------------------------------------------------

struct roundtrip_options {
  std::string in, out, zp_layout = "auto", scale_dtype = "bf16", name = "weight";
  int32_t group_size = 128;
};

void run_roundtrip(const roundtrip_options& o) {
  const std::filesystem::path in = o.in;
  auto packed_npy = read_npy((in / "weight_packed.npy").string());
  auto scale_npy = read_npy((in / "weight_scale.npy").string());
  auto shape_npy = read_npy((in / "weight_shape.npy").string());
  const bool asym = std::filesystem::exists(in / "weight_zero_point.npy");
  if (packed_npy.descr != "<i4" && packed_npy.descr != "<u4")
    throw command_failed(fmt::format("{}: weight_packed must be int32, not '{}'", o.name, packed_npy.descr));
  if (scale_npy.descr != "<u2" && scale_npy.descr != "<f2")
    throw command_failed(fmt::format("{}: weight_scale must be 16-bit (bf16 bits as uint16, or float16), not '{}'",
                                     o.name, scale_npy.descr));
  std::vector<int64_t> nk;
  if (shape_npy.descr == "<i8")
    nk = shape_npy.as<int64_t>();
  else if (shape_npy.descr == "<i4")
    for (int32_t v : shape_npy.as<int32_t>())
      nk.push_back(v);
  if (nk.size() != 2)
    throw command_failed(fmt::format("{}: weight_shape must hold (n, k)", o.name));

  auto shape = k4::ct_infer_shape(packed_npy.shape, scale_npy.shape, nk[0], nk[1], o.group_size, o.name);
  if (!shape)
    throw command_failed(shape.error());
  const k4::int4_shape s = *shape;
  const bool batched = packed_npy.shape.size() == 3;
  k4::zero_point_layout layout = k4::zero_point_layout::standard;
  npy_array zp_npy;
  if (asym) {
    zp_npy = read_npy((in / "weight_zero_point.npy").string());
    if (zp_npy.descr != "<i4" && zp_npy.descr != "<u4")
      throw command_failed(fmt::format("{}: weight_zero_point must be int32, not '{}'", o.name, zp_npy.descr));
    k4::zero_point_layout_hint hint = k4::zero_point_layout_hint::auto_detect;
    if (o.zp_layout == "standard")
      hint = k4::zero_point_layout_hint::standard;
    else if (o.zp_layout == "miles")
      hint = k4::zero_point_layout_hint::miles;
    else if (o.zp_layout != "auto")
      throw command_failed(fmt::format("--zp-layout {}: use auto, standard or miles", o.zp_layout));
    auto detected = k4::detect_zero_point_layout(zp_npy.shape, s, hint, o.name);
    if (!detected)
      throw command_failed(detected.error());
    layout = *detected;
  }
  k4::int4_scale_type scale_type = k4::int4_scale_type::bf16;
  if (o.scale_dtype == "f16" || scale_npy.descr == "<f2")
    scale_type = k4::int4_scale_type::f16;
  else if (o.scale_dtype != "bf16")
    throw command_failed(fmt::format("--scale-dtype {}: use bf16 or f16", o.scale_dtype));

  const auto packed = packed_npy.as<int32_t>();
  const auto scale = scale_npy.as<uint16_t>();
  const auto zp = asym ? zp_npy.as<int32_t>() : std::vector<int32_t>{};
  std::vector<int32_t> sw(k4::serving_weight_words(s)), sz(asym ? k4::serving_zero_point_words(s) : 0);
  std::vector<uint16_t> ss(k4::serving_scale_count(s));
  k4::serving_repack_args r{s, asym, layout, packed.data(), scale.data(), asym ? zp.data() : nullptr,
                            sw.data(), ss.data(), asym ? sz.data() : nullptr};
  if (auto st = k4::serving_repack(r, o.name); !st)
    throw command_failed(st.error());
  std::vector<int32_t> rp(packed.size()), rz(zp.size());
  std::vector<uint16_t> rs(scale.size());
  k4::serving_restore_args b{s, asym, layout, sw.data(), ss.data(), asym ? sz.data() : nullptr,
                             rp.data(), rs.data(), asym ? rz.data() : nullptr};
  if (auto st = k4::serving_restore(b, o.name); !st)
    throw command_failed(st.error());

  std::vector<uint16_t> dq_load(static_cast<std::size_t>(s.batch * s.n * s.k));
  std::vector<uint16_t> dq_serving(dq_load.size());
  k4::ct_dequant_args dl{s, asym, layout, scale_type, packed.data(), scale.data(), asym ? zp.data() : nullptr,
                         dq_load.data()};
  k4::serving_dequant_args ds{s, asym, scale_type, sw.data(), ss.data(), asym ? sz.data() : nullptr,
                              dq_serving.data()};
  if (k4::ct_dequant_ref(dl) != k4::kernel_status::ok || k4::serving_dequant_ref(ds) != k4::kernel_status::ok)
    throw command_failed(fmt::format("{}: dequantization failed", o.name));

  std::filesystem::create_directories(o.out);
  const std::filesystem::path dir = o.out;
  const int64_t groups = k4::int4_groups(s);
  write_vec(dir, "serving_weight.npy", "<i4", dims(s, batched, {s.k / 16, 2 * s.n}), sw);
  write_vec(dir, "serving_scale.npy", "<u2", dims(s, batched, {groups, s.n}), ss);
  write_npy(dir / "weight_packed.npy", packed_npy.descr, packed_npy.shape, rp.data(), rp.size() * 4);
  write_npy(dir / "weight_scale.npy", scale_npy.descr, scale_npy.shape, rs.data(), rs.size() * 2);
  write_npy(dir / "weight_shape.npy", shape_npy.descr, shape_npy.shape, shape_npy.data.data(), shape_npy.data.size());
  if (asym) {
    write_vec(dir, "serving_zero_point.npy", "<i4", dims(s, batched, {groups, s.n / 8}), sz);
    write_npy(dir / "weight_zero_point.npy", zp_npy.descr, zp_npy.shape, rz.data(), rz.size() * 4);
  }
  write_vec(dir, "dequant_load.npy", "<u2", dims(s, batched, {s.n, s.k}), dq_load);
  write_vec(dir, "dequant_serving.npy", "<u2", dims(s, batched, {s.n, s.k}), dq_serving);
  std::printf("{\"batch\": %lld, \"n\": %lld, \"k\": %lld, \"group_size\": %d, \"zero_point_layout\": \"%s\"}\n",
              static_cast<long long>(s.batch), static_cast<long long>(s.n), static_cast<long long>(s.k),
              s.group_size, asym ? std::string(k4::to_string(layout)).c_str() : "none");
}

void add_int4(CLI::App& app) {
  auto* cmd = app.add_subcommand("int4", "INT4 format tools for tests (quantize, roundtrip) on .npy files");
  cmd->group(""); // hidden from --help: a test hook, not a user command
  cmd->require_subcommand(1);

  auto q = std::make_shared<quantize_options>();
  auto* qc = cmd->add_subcommand("quantize", "BF16 .npy -> compressed-tensors pack-quantized .npy files");
  qc->add_option("--in", q->in, "weights: uint16 bf16 bits or float32, [n, k] or [experts, n, k]")->required();
  qc->add_option("--out", q->out, "output directory")->required();
  qc->add_option("--recipe", q->recipe, "int4-asym (default), int4-sym or int4-sym-qat");
  qc->add_option("--group-size", q->group_size, "32, 64, 128 (default), or -1 for per-channel");
  qc->add_option("--zp-layout", q->zp_layout, "zero-point layout: standard (default) or miles");
  qc->add_option("--name", q->name, "tensor name used in messages");
  qc->add_flag("--serving", q->serving, "also write the serving layout from the fused path");
  qc->callback([q] { run_quantize(*q); });

  auto r = std::make_shared<roundtrip_options>();
  auto* rc = cmd->add_subcommand("roundtrip", "load format -> serving layout -> load format, with dequants");
  rc->add_option("--in", r->in, "directory with weight_packed/weight_scale/weight_shape[/weight_zero_point].npy")
    ->required();
  rc->add_option("--out", r->out, "output directory")->required();
  rc->add_option("--group-size", r->group_size, "the configured group size (-1 for per-channel)");
  rc->add_option("--zp-layout", r->zp_layout, "auto (default; from shapes), standard or miles");
  rc->add_option("--scale-dtype", r->scale_dtype, "bf16 (default) or f16 (implied by a float16 .npy)");
  rc->add_option("--name", r->name, "tensor name used in messages");
  rc->callback([r] { run_roundtrip(*r); });
}

const command_registrar registrar{95, add_int4};

} // namespace

} // namespace rlserve::apps
