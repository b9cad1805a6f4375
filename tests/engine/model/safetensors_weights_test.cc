// SafetensorsWeights: float tensors converted to fp32, quantized linear
// weights handed out as stored, and every failure named.
#include "engine/model/safetensors_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/model/safetensors_writer.h"
#include "util/bf16.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Tensor = SafetensorsWriter::Tensor;

Tensor Bytes(const std::string& name, TensorDtype dtype, std::vector<int64_t> shape,
             uint8_t start) {
  Tensor t{name, dtype, std::move(shape), {}};
  t.bytes.resize(NumElements(t.shape) * TensorDtypeSize(dtype));
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<char>(start + i * 7);
  return t;
}

Tensor Floats(const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
  Tensor t{name, TensorDtype::kF32, std::move(shape), {}};
  t.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  return t;
}

Tensor Bf16s(const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
  Tensor t{name, TensorDtype::kBF16, std::move(shape), {}};
  for (float f : v) {
    const uint16_t h = F32ToBf16(f);
    t.bytes.push_back(static_cast<char>(h & 0xFF));
    t.bytes.push_back(static_cast<char>(h >> 8));
  }
  return t;
}

QuantConfig Config(const std::string& text) {
  auto q = ParseQuantConfig(nlohmann::json::parse(R"({"quantization_config": )" + text + "}"), "c");
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  return *q;
}

const char* kFp8 = R"({"quant_method": "fp8", "weight_block_size": [2, 4]})";
const char* kMx = R"({"quant_method": "mxfp4"})";
std::string Ct(const std::string& strategy) {
  return R"({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights":
            {"num_bits": 8, "type": "float", "strategy": ")" +
         strategy + R"("}}}})";
}

class SafetensorsWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("st_weights_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  SafetensorsWeights Write(const std::vector<Tensor>& ts) {
    const fs::path p = dir_ / "model.safetensors";
    Status st = SafetensorsWriter::WriteFile(p, ts);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto w = SafetensorsWeights::Open(p);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::move(w).value();
  }

  fs::path dir_;
};

TEST_F(SafetensorsWeightsTest, Fp8BlockAsStored) {
  // 5 x 6 with 2 x 4 tiles: 3 x 2 scales (ragged edges), in bf16.
  const std::vector<float> sc = {0.5f, 1.f, 2.f, 4.f, 0.25f, 8.f};
  SafetensorsWeights w = Write({Bytes("a.weight", TensorDtype::kF8E4M3, {5, 6}, 1),
                                Bf16s("a.weight_scale_inv", {3, 2}, sc),
                                Bf16s("norm.weight", {6}, {1, 2, 3, 4, 5, 6})});
  EXPECT_TRUE(w.IsQuantized("a.weight"));
  EXPECT_FALSE(w.IsQuantized("norm.weight"));
  EXPECT_FALSE(w.IsQuantized("missing.weight"));
  const std::vector<int64_t> shape = {5, 6};
  auto q = w.LoadQuantized("a.weight", shape, Config(kFp8));
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->format, QuantFormat::kFp8Block);
  EXPECT_EQ(q->rows, 5);
  EXPECT_EQ(q->cols, 6);
  EXPECT_EQ(q->block_rows, 2);
  EXPECT_EQ(q->block_cols, 4);
  EXPECT_EQ(q->scales, sc);
  ASSERT_EQ(q->codes.size(), 30u);
  for (size_t i = 0; i < 30; ++i) EXPECT_EQ(q->codes[i], static_cast<uint8_t>(1 + i * 7));
  EXPECT_EQ(q->bytes(), 30u + 6u * 4u);
  // Read as fp32 it is refused, not misread.
  auto f = w.LoadF32("a.weight", shape);
  EXPECT_THAT(f.status().message(), HasSubstr("quantized"));
  // Float tensors load as before.
  const std::vector<int64_t> nshape = {6};
  auto n = w.LoadF32("norm.weight", nshape);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ((*n)[5], 6.f);
}

TEST_F(SafetensorsWeightsTest, Fp8Errors) {
  SafetensorsWeights w = Write({Bytes("a.weight", TensorDtype::kF8E4M3, {5, 6}, 1),
                                Floats("a.weight_scale_inv", {3, 1}, {1, 2, 3}),
                                Bytes("b.weight", TensorDtype::kF8E4M3, {5, 6}, 1),
                                Bytes("c.weight", TensorDtype::kF8E4M3, {5, 6}, 1),
                                Bytes("c.weight_scale_inv", TensorDtype::kU8, {3, 2}, 0),
                                Floats("d.weight", {2, 2}, {1, 2, 3, 4})});
  const std::vector<int64_t> shape = {5, 6};
  EXPECT_THAT(w.LoadQuantized("a.weight", shape, Config(kFp8)).status().message(),
              HasSubstr("[3, 2]"));  // wrong scale shape
  EXPECT_THAT(w.LoadQuantized("b.weight", shape, Config(kFp8)).status().message(),
              HasSubstr("b.weight_scale_inv"));  // missing scales
  EXPECT_THAT(w.LoadQuantized("c.weight", shape, Config(kFp8)).status().message(),
              HasSubstr("U8"));  // scales of a non-float dtype
  EXPECT_THAT(w.LoadQuantized("a.weight", shape, QuantConfig{}).status().message(),
              HasSubstr("quant_method is none"));
  const std::vector<int64_t> wrong = {6, 5};
  EXPECT_THAT(w.LoadQuantized("a.weight", wrong, Config(kFp8)).status().message(),
              HasSubstr("shape"));
  const std::vector<int64_t> s22 = {2, 2};
  EXPECT_EQ(w.LoadQuantized("d.weight", s22, Config(kFp8)).status().code(),
            StatusCode::kUnimplemented);
  const std::vector<int64_t> flat = {30};
  EXPECT_THAT(w.LoadQuantized("a.weight", flat, Config(kFp8)).status().message(),
              HasSubstr("[.., out, in]"));
}

TEST_F(SafetensorsWeightsTest, CompressedTensorsChannelAndTensor) {
  SafetensorsWeights w =
      Write({Bytes("a.weight", TensorDtype::kF8E4M3, {3, 4}, 2),
             Bf16s("a.weight_scale", {3, 1}, {0.5f, 2.f, 4.f}),
             Bytes("b.weight", TensorDtype::kF8E4M3, {3, 4}, 3),
             Floats("b.weight_scale", {3}, {1.f, 2.f, 3.f}),
             Bytes("c.weight", TensorDtype::kF8E4M3, {3, 4}, 4),
             Floats("c.weight_scale", {}, {0.125f}), Floats("c.input_scale", {}, {1.f})});
  const std::vector<int64_t> shape = {3, 4};
  auto a = w.LoadQuantized("a.weight", shape, Config(Ct("channel")));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->format, QuantFormat::kFp8Channel);
  EXPECT_EQ(a->scales, (std::vector<float>{0.5f, 2.f, 4.f}));
  auto b = w.LoadQuantized("b.weight", shape, Config(Ct("channel")));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto c = w.LoadQuantized("c.weight", shape, Config(Ct("tensor")));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->format, QuantFormat::kFp8Tensor);
  EXPECT_EQ(c->scales, (std::vector<float>{0.125f}));
  // A per-tensor scale where the config says per channel, and the reverse.
  EXPECT_THAT(w.LoadQuantized("c.weight", shape, Config(Ct("channel"))).status().message(),
              HasSubstr("c.weight_scale"));
  EXPECT_THAT(w.LoadQuantized("a.weight", shape, Config(Ct("tensor"))).status().message(),
              HasSubstr("one value"));
  // The fp8 method reads weight_scale_inv, which this checkpoint lacks.
  EXPECT_THAT(w.LoadQuantized("a.weight", shape, Config(kFp8)).status().message(),
              HasSubstr("a.weight_scale_inv"));
}

TEST_F(SafetensorsWeightsTest, Mxfp4AsStored) {
  // Two experts of 3 x 64: blocks [2, 3, 2, 16], scales [2, 3, 2].
  SafetensorsWeights w = Write({Bytes("e.gate_up_proj_blocks", TensorDtype::kU8, {2, 3, 2, 16}, 5),
                                Bytes("e.gate_up_proj_scales", TensorDtype::kU8, {2, 3, 2}, 100),
                                Bytes("f_blocks", TensorDtype::kU8, {3, 2, 16}, 5),
                                Bytes("f_scales", TensorDtype::kF8E4M3, {3, 2}, 100),
                                Bytes("g_blocks", TensorDtype::kU8, {3, 2, 16}, 5)});
  EXPECT_TRUE(w.IsQuantized("e.gate_up_proj"));
  const std::vector<int64_t> shape = {2, 3, 64};
  auto q = w.LoadQuantized("e.gate_up_proj", shape, Config(kMx));
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->format, QuantFormat::kMxfp4);
  EXPECT_EQ(q->batch, 2);
  EXPECT_EQ(q->rows, 3);
  EXPECT_EQ(q->cols, 64);
  EXPECT_EQ(q->codes.size(), 192u);
  EXPECT_EQ(q->exponents.size(), 12u);
  EXPECT_EQ(q->exponents[1], static_cast<uint8_t>(107));
  EXPECT_EQ(q->bytes(), 204u);
  // Errors: the config says otherwise; the wrong logical shape; scales of
  // the wrong dtype; scales missing; a width not a multiple of 32.
  EXPECT_THAT(w.LoadQuantized("e.gate_up_proj", shape, Config(kFp8)).status().message(),
              HasSubstr("not mxfp4"));
  const std::vector<int64_t> other = {2, 64, 3};
  EXPECT_FALSE(w.LoadQuantized("e.gate_up_proj", other, Config(kMx)).ok());
  const std::vector<int64_t> s2 = {3, 64};
  EXPECT_THAT(w.LoadQuantized("f", s2, Config(kMx)).status().message(), HasSubstr("F8_E4M3"));
  EXPECT_THAT(w.LoadQuantized("g", s2, Config(kMx)).status().message(), HasSubstr("g_scales"));
  const std::vector<int64_t> s48 = {3, 48};
  EXPECT_THAT(w.LoadQuantized("g", s48, Config(kMx)).status().message(),
              HasSubstr("multiple of 32"));
}

}  // namespace
}  // namespace agentkv::model
