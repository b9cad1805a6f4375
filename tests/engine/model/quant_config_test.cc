#include "engine/model/quant_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/model/model_config.h"

namespace agentkv::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

Result<QuantConfig> Parse(const std::string& quantization_config) {
  return ParseQuantConfig(json::parse(R"({"quantization_config": )" + quantization_config + "}"),
                          "config.json");
}

TEST(QuantConfigTest, NoneWhenAbsentOrNull) {
  auto a = ParseQuantConfig(json::parse("{}"), "c");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->quantized());
  EXPECT_FALSE(a->Covers("model.layers.0.mlp.down_proj"));
  auto b = Parse("null");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->method, QuantMethod::kNone);
}

TEST(QuantConfigTest, Fp8Block) {
  // As Qwen3-8B-FP8 publishes it.
  auto q = Parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                     "weight_block_size": [128, 64], "modules_to_not_convert": ["mlp.gate"]})");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->method, QuantMethod::kFp8);
  EXPECT_EQ(q->format, QuantFormat::kFp8Block);
  EXPECT_EQ(q->block_rows, 128);
  EXPECT_EQ(q->block_cols, 64);
  EXPECT_TRUE(q->Covers("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(q->Covers("model.layers.0.mlp.gate"));  // substring, as transformers matches
  // fmt may be absent (defaults to e4m3).
  EXPECT_TRUE(Parse(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})").ok());
}

TEST(QuantConfigTest, Fp8Errors) {
  EXPECT_THAT(Parse(R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})")
                  .status()
                  .message(),
              HasSubstr("fmt"));
  EXPECT_THAT(Parse(R"({"quant_method": "fp8"})").status().message(),
              HasSubstr("weight_block_size"));
  EXPECT_THAT(Parse(R"({"quant_method": "fp8", "weight_block_size": [128]})").status().message(),
              HasSubstr("weight_block_size"));
  EXPECT_THAT(Parse(R"({"quant_method": "fp8", "weight_block_size": [0, 128]})").status().message(),
              HasSubstr("positive"));
  EXPECT_THAT(Parse(R"({"quant_method": "fp8", "weight_block_size": [128, 128],
                        "modules_to_not_convert": "lm_head"})")
                  .status()
                  .message(),
              HasSubstr("modules_to_not_convert"));
  EXPECT_THAT(Parse(R"({"quant_method": "awq"})").status().message(), HasSubstr("awq"));
  EXPECT_THAT(Parse(R"({"bits": 4})").status().message(), HasSubstr("quant_method"));
  EXPECT_THAT(Parse(R"("fp8")").status().message(), HasSubstr("not an object"));
}

TEST(QuantConfigTest, Mxfp4) {
  auto q = Parse(R"({"quant_method": "mxfp4", "modules_to_not_convert":
      ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]})");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->method, QuantMethod::kMxfp4);
  EXPECT_EQ(q->format, QuantFormat::kMxfp4);
  EXPECT_EQ(q->not_converted.size(), 4u);
  EXPECT_FALSE(q->Covers("lm_head"));
  EXPECT_TRUE(q->Covers("model.layers.3.mlp.experts"));
}

std::string Compressed(const std::string& weights, const std::string& extra = "") {
  return R"({"quant_method": "compressed-tensors", "format": "float-quantized",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": )" +
         weights + "}}" + extra + "}";
}

TEST(QuantConfigTest, CompressedTensorsStrategies) {
  auto ch = Parse(Compressed(R"({"num_bits": 8, "type": "float", "strategy": "channel"})",
                             R"(, "ignore": ["lm_head", "re:.*mlp\\.gate$"])"));
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  EXPECT_EQ(ch->method, QuantMethod::kCompressedTensors);
  EXPECT_EQ(ch->format, QuantFormat::kFp8Channel);
  EXPECT_THAT(ch->not_converted, ElementsAre("lm_head", "re:.*mlp\\.gate$"));
  EXPECT_FALSE(ch->Covers("lm_head"));
  EXPECT_TRUE(ch->Covers("lm_head_2"));  // exact names, not substrings
  EXPECT_FALSE(ch->Covers("model.layers.1.mlp.gate"));
  EXPECT_TRUE(ch->Covers("model.layers.1.mlp.gate_proj"));
  auto te = Parse(Compressed(R"({"num_bits": 8, "type": "float", "strategy": "tensor"})"));
  ASSERT_TRUE(te.ok());
  EXPECT_EQ(te->format, QuantFormat::kFp8Tensor);
  auto bl = Parse(Compressed(
      R"({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [64, 32]})"));
  ASSERT_TRUE(bl.ok()) << bl.status().ToString();
  EXPECT_EQ(bl->format, QuantFormat::kFp8Block);
  EXPECT_EQ(bl->block_rows, 64);
  EXPECT_EQ(bl->block_cols, 32);
  // The older key.
  auto old = ParseQuantConfig(
      json::parse(R"({"compression_config": )" +
                  Compressed(R"({"num_bits": 8, "type": "float", "strategy": "channel"})") + "}"),
      "c");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->format, QuantFormat::kFp8Channel);
}

TEST(QuantConfigTest, CompressedTensorsErrors) {
  EXPECT_THAT(Parse(Compressed(R"({"num_bits": 4, "type": "int", "strategy": "group"})"))
                  .status()
                  .message(),
              HasSubstr("8-bit float"));
  EXPECT_THAT(Parse(Compressed(R"({"num_bits": 8, "type": "float", "strategy": "group"})"))
                  .status()
                  .message(),
              HasSubstr("group"));
  EXPECT_THAT(Parse(Compressed(R"({"num_bits": 8, "type": "float", "strategy": "block"})"))
                  .status()
                  .message(),
              HasSubstr("block_structure"));
  EXPECT_THAT(Parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
                        "config_groups": {}})")
                  .status()
                  .message(),
              HasSubstr("pack-quantized"));
  EXPECT_THAT(Parse(R"({"quant_method": "compressed-tensors"})").status().message(),
              HasSubstr("config_groups"));
  EXPECT_THAT(Parse(R"({"quant_method": "compressed-tensors", "config_groups":
                          {"a": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}},
                           "b": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}})")
                  .status()
                  .message(),
              HasSubstr("mix"));
}

TEST(QuantConfigTest, ModelConfigCarriesIt) {
  const std::string base =
      R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 100,
          "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "max_position_embeddings": 1024)";
  auto plain = ModelConfig::FromJsonText(base + "}", "config.json");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->quant.quantized());
  auto fp8 = ModelConfig::FromJsonText(
      base +
          R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})",
      "config.json");
  ASSERT_TRUE(fp8.ok()) << fp8.status().ToString();
  EXPECT_EQ(fp8->quant.method, QuantMethod::kFp8);
  EXPECT_NE(*fp8, *plain);
  auto bad = ModelConfig::FromJsonText(
      base + R"(, "quantization_config": {"quant_method": "gptq"}})", "config.json");
  EXPECT_THAT(bad.status().message(), HasSubstr("config.json"));
  EXPECT_THAT(bad.status().message(), HasSubstr("gptq"));
}

}  // namespace
}  // namespace agentkv::model
