// model/checkpoint: single-file and sharded HF checkpoint directories, and their error cases.
#include <boost/test/unit_test.hpp>

#include "tests/support/test_support.hpp"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/checkpoint.hpp"
#include "model/safetensors.hpp"

namespace fs = std::filesystem;
using rlserve::dtype;
using rlserve::HostTensor;
using rlserve::NamedTensor;
using rlserve::model::checkpoint;
using rlserve::model::write_checkpoint;
using rlserve::model::write_safetensors;
using json = nlohmann::json;

namespace {

using rlserve::test::temp_dir;
using rlserve::test::why;



// `count` f32 tensors "layer.{i}.w" of `floats` elements each, filled with i + j / 1000.
std::vector<NamedTensor> tensors(int count, int floats) {
  std::vector<NamedTensor> out;
  for (int i = 0; i < count; ++i) {
    std::vector<float> v(floats);
    for (int j = 0; j < floats; ++j)
      v[j] = float(i) + float(j) / 1000.0f;
    out.push_back({"layer." + std::to_string(i) + ".w",
                   HostTensor::from_vector(dtype::f32, {int64_t(floats)}, v)});
  }
  return out;
}

void expect_same(const checkpoint& c, const std::vector<NamedTensor>& want) {
  std::vector<std::string> names;
  for (const auto& t : want)
    names.push_back(t.name);
  std::sort(names.begin(), names.end());
  BOOST_TEST(c.names() == names);
  for (const auto& t : want) {
    BOOST_TEST(c.contains(t.name));
    auto got = c.tensor(t.name);
    BOOST_REQUIRE_MESSAGE(got, why(got));
    BOOST_TEST(got->shape == t.tensor.shape);
    BOOST_TEST(std::memcmp(got->data.get(), t.tensor.data.get(), t.tensor.nbytes) == 0);
  }
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

void expect_error(const fs::path& dir, std::initializer_list<std::string> parts) {
  auto c = checkpoint::open(dir);
  BOOST_REQUIRE_MESSAGE(!c, "expected " << dir << " to be refused");
  for (const auto& p : parts)
    BOOST_TEST(c.error().find(p) != std::string::npos, "'" << p << "' not in: " << c.error());
}

} // namespace

BOOST_AUTO_TEST_SUITE(checkpoint_test)

BOOST_AUTO_TEST_CASE(single_file_round_trip) {
  temp_dir dir;
  auto want = tensors(5, 16);
  auto s = write_checkpoint(dir.path, want);
  BOOST_REQUIRE_MESSAGE(s, why(s));
  BOOST_TEST(fs::exists(dir.path / "model.safetensors"));
  BOOST_TEST(!fs::exists(dir.path / "model.safetensors.index.json"));
  auto c = checkpoint::open(dir.path);
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->files().size() == 1u);
  expect_same(*c, want);
  // transformers refuses safetensors files without format=pt.
  auto f = rlserve::model::safetensors_file::open(dir.path / "model.safetensors");
  BOOST_REQUIRE(f);
  BOOST_TEST(f->metadata().at("format") == "pt");

  // A bare .safetensors path works too.
  auto direct = checkpoint::open(dir.path / "model.safetensors");
  BOOST_REQUIRE_MESSAGE(direct, why(direct));
  expect_same(*direct, want);
}

BOOST_AUTO_TEST_CASE(sharded_round_trip_with_index) {
  temp_dir dir;
  auto want = tensors(7, 16); // 64 bytes each; 150-byte shards hold two
  auto s = write_checkpoint(dir.path, want, 150);
  BOOST_REQUIRE_MESSAGE(s, why(s));
  BOOST_TEST(!fs::exists(dir.path / "model.safetensors"));
  BOOST_TEST(fs::exists(dir.path / "model-00001-of-00004.safetensors"));
  BOOST_TEST(fs::exists(dir.path / "model-00004-of-00004.safetensors"));
  json index = json::parse(std::ifstream(dir.path / "model.safetensors.index.json"));
  BOOST_TEST(index["metadata"]["total_size"] == 7 * 64);
  BOOST_TEST(index["weight_map"].size() == 7u);
  BOOST_TEST(index["weight_map"]["layer.0.w"] == "model-00001-of-00004.safetensors");
  BOOST_TEST(index["weight_map"]["layer.6.w"] == "model-00004-of-00004.safetensors");

  auto c = checkpoint::open(dir.path);
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->files().size() == 4u);
  expect_same(*c, want);
}

BOOST_AUTO_TEST_CASE(a_tensor_over_the_limit_gets_its_own_shard) {
  temp_dir dir;
  auto want = tensors(3, 16);
  want.push_back({"big", HostTensor::from_vector(dtype::f32, {100}, std::vector<float>(100, 1.f))});
  auto s = write_checkpoint(dir.path, want, 100);
  BOOST_REQUIRE_MESSAGE(s, why(s));
  auto c = checkpoint::open(dir.path);
  BOOST_REQUIRE_MESSAGE(c, why(c));
  // Name order: big (400 bytes, alone), then 64-byte tensors of which two exceed 100: one each.
  BOOST_TEST(c->files().size() == 4u);
  expect_same(*c, want);
}

BOOST_AUTO_TEST_CASE(rewriting_replaces_the_old_layout) {
  temp_dir dir;
  BOOST_REQUIRE(write_checkpoint(dir.path, tensors(6, 16), 100));
  BOOST_TEST(fs::exists(dir.path / "model.safetensors.index.json"));
  auto want = tensors(2, 8);
  BOOST_REQUIRE(write_checkpoint(dir.path, want));
  BOOST_TEST(!fs::exists(dir.path / "model.safetensors.index.json"));
  BOOST_TEST(!fs::exists(dir.path / "model-00001-of-00006.safetensors"));
  auto c = checkpoint::open(dir.path);
  BOOST_REQUIRE_MESSAGE(c, why(c));
  expect_same(*c, want);
}

// MoE experts saved fused (transformers 5 with save_original_format=False): gate_up_proj
// [E, 2I, H] and down_proj [E, H, I] are served as the hub's per-expert tensors, gate the first I
// rows of each expert; the fused names are not listed; in a sharded checkpoint too.
BOOST_AUTO_TEST_CASE(fused_experts_are_served_per_expert) {
  const int64_t E = 3, I = 2, H = 5;
  std::vector<float> gu(static_cast<std::size_t>(E * 2 * I * H)), dn(static_cast<std::size_t>(E * H * I));
  for (std::size_t i = 0; i < gu.size(); ++i)
    gu[i] = float(i);
  for (std::size_t i = 0; i < dn.size(); ++i)
    dn[i] = 1000.0f + float(i);
  const std::string p = "model.layers.1.mlp.experts.";
  std::vector<NamedTensor> fused{{p + "gate_up_proj", HostTensor::from_vector(dtype::f32, {E, 2 * I, H}, gu)},
                                 {p + "down_proj", HostTensor::from_vector(dtype::f32, {E, H, I}, dn)},
                                 {"model.norm.weight", HostTensor::from_vector(dtype::f32, {H}, std::vector<float>(5, 1.0f))}};
  // What the hub format holds for the same weights.
  std::vector<NamedTensor> want{fused[2]};
  for (int64_t e = 0; e < E; ++e) {
    auto slice = [&](const std::vector<float>& v, int64_t at, int64_t rows, int64_t cols) {
      return HostTensor::from_vector(dtype::f32, {rows, cols},
                                     std::vector<float>(v.begin() + at, v.begin() + at + rows * cols));
    };
    const auto ex = p + std::to_string(e) + ".";
    want.push_back({ex + "gate_proj.weight", slice(gu, e * 2 * I * H, I, H)});
    want.push_back({ex + "up_proj.weight", slice(gu, e * 2 * I * H + I * H, I, H)});
    want.push_back({ex + "down_proj.weight", slice(dn, e * H * I, H, I)});
  }
  for (std::size_t shard_bytes : {std::size_t{1} << 20, std::size_t{64}}) { // one file; a shard per tensor
    temp_dir dir;
    BOOST_REQUIRE(write_checkpoint(dir.path, fused, shard_bytes));
    auto c = checkpoint::open(dir.path);
    BOOST_REQUIRE_MESSAGE(c, why(c));
    expect_same(*c, want);
    BOOST_TEST(!c->contains(p + "gate_up_proj"));
    BOOST_TEST(!c->tensor(p + "down_proj"));
  }

  // An expert both fused and saved on its own, and fused tensors of a shape that cannot be split.
  temp_dir both;
  auto twice = fused;
  twice.push_back(want[1]);
  BOOST_REQUIRE(write_checkpoint(both.path, twice));
  expect_error(both.path, {"experts.0.gate_proj.weight", "both in the fused tensor", "gate_up_proj"});
  temp_dir flat;
  std::vector<NamedTensor> two_d{{p + "gate_up_proj", HostTensor::from_vector(dtype::f32, {2 * I, H}, std::vector<float>(20))}};
  BOOST_REQUIRE(write_checkpoint(flat.path, two_d));
  expect_error(flat.path, {"fused expert tensor", "shape [4, 5]", "[experts, 2 x intermediate, hidden]"});
  temp_dir odd;
  std::vector<NamedTensor> odd_rows{{p + "gate_up_proj", HostTensor::from_vector(dtype::f32, {1, 3, 2}, std::vector<float>(6))}};
  BOOST_REQUIRE(write_checkpoint(odd.path, odd_rows));
  expect_error(odd.path, {"shape [1, 3, 2]"});
}

BOOST_AUTO_TEST_CASE(index_naming_a_missing_shard) {
  temp_dir dir;
  BOOST_REQUIRE(write_checkpoint(dir.path, tensors(4, 16), 100));
  fs::remove(dir.path / "model-00003-of-00004.safetensors");
  expect_error(dir.path, {"model.safetensors.index.json", "'model-00003-of-00004.safetensors'",
                          "does not exist"});
}

BOOST_AUTO_TEST_CASE(index_listing_a_tensor_absent_from_its_shard) {
  temp_dir dir;
  BOOST_REQUIRE(write_checkpoint(dir.path, tensors(4, 16), 100));
  json index = json::parse(std::ifstream(dir.path / "model.safetensors.index.json"));
  index["weight_map"]["layer.9.w"] = "model-00002-of-00004.safetensors";
  write_text(dir.path / "model.safetensors.index.json", index.dump());
  expect_error(dir.path, {"'layer.9.w'", "'model-00002-of-00004.safetensors'", "no such tensor"});
}

BOOST_AUTO_TEST_CASE(the_same_tensor_in_two_shards) {
  temp_dir dir;
  auto t = tensors(2, 4);
  BOOST_REQUIRE(write_safetensors(dir.path / "a.safetensors", t));
  BOOST_REQUIRE(write_safetensors(dir.path / "b.safetensors", std::vector<NamedTensor>{t[1]}));
  json index = {{"weight_map", {{"layer.0.w", "a.safetensors"}, {"layer.1.w", "b.safetensors"}}}};
  write_text(dir.path / "model.safetensors.index.json", index.dump());
  expect_error(dir.path, {"'layer.1.w'", "two shards", "'a.safetensors'", "'b.safetensors'"});
}

BOOST_AUTO_TEST_CASE(bad_index_files) {
  temp_dir dir;
  write_text(dir.path / "model.safetensors.index.json", "{not json");
  expect_error(dir.path, {"model.safetensors.index.json", "not a JSON object"});
  write_text(dir.path / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error(dir.path, {"missing 'weight_map'"});
  write_text(dir.path / "model.safetensors.index.json", R"({"weight_map": {"w": 3}})");
  expect_error(dir.path, {"weight_map['w']", "file name"});
}

BOOST_AUTO_TEST_CASE(no_safetensors_says_what_was_looked_for) {
  temp_dir dir;
  expect_error(dir.path, {dir.path.string(), "no model.safetensors",
                          "model.safetensors.index.json"});
  BOOST_REQUIRE(write_safetensors(dir.path / "other.safetensors", tensors(1, 2)));
  expect_error(dir.path, {"found other.safetensors without an index"});
  expect_error(dir.path / "missing", {"missing", "no such file or directory"});
}

BOOST_AUTO_TEST_CASE(a_corrupt_shard_is_reported_with_its_path) {
  temp_dir dir;
  BOOST_REQUIRE(write_checkpoint(dir.path, tensors(1, 4)));
  fs::resize_file(dir.path / "model.safetensors", 4);
  expect_error(dir.path, {"model.safetensors", "4 bytes"});
}

BOOST_AUTO_TEST_SUITE_END()
