#include "engine/model/model_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/model/safetensors_writer.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ModelFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("model_files_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    Text("config.json", R"({"b": 1, "a": [1, 2]})");
    Text("tokenizer.json", R"({"model": {}})");
    // 3 MiB of data, so the first and last MiB do not overlap.
    Weights("model.safetensors", 3u << 20);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Text(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
  }
  void Weights(const std::string& name, size_t bytes) {
    std::string data(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 31);
    ASSERT_TRUE(
        SafetensorsWriter::WriteFile(
            dir_ / name, {{"w", TensorDtype::kF32, {static_cast<int64_t>(bytes / 4)}, data}})
            .ok());
  }
  // Flips one byte of a file at `offset` from its start (negative: from the end).
  void Flip(const std::string& name, int64_t offset) {
    fs::path p = dir_ / name;
    int64_t size = static_cast<int64_t>(fs::file_size(p));
    std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    int64_t at = offset >= 0 ? offset : size + offset;
    f.seekg(at);
    char c = 0;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 1));
  }
  std::string Fp() {
    auto m = ModelFiles::Locate(dir_);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    auto fp = m->Fingerprint();
    EXPECT_TRUE(fp.ok()) << fp.status().ToString();
    return *fp;
  }

  fs::path dir_;
};

TEST_F(ModelFilesTest, LocatesFiles) {
  auto m = ModelFiles::Locate(dir_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config, dir_ / "config.json");
  EXPECT_EQ(m->tokenizer, dir_ / "tokenizer.json");
  EXPECT_TRUE(m->tokenizer_config.empty());
  EXPECT_TRUE(m->generation_config.empty());
  EXPECT_TRUE(m->weight_index.empty());
  EXPECT_EQ(m->weights, (std::vector<fs::path>{dir_ / "model.safetensors"}));
  Text("tokenizer_config.json", "{}");
  Text("generation_config.json", "{}");
  m = ModelFiles::Locate(dir_);
  EXPECT_EQ(m->tokenizer_config, dir_ / "tokenizer_config.json");
  EXPECT_EQ(m->generation_config, dir_ / "generation_config.json");
}

TEST_F(ModelFilesTest, ShardIndex) {
  fs::remove(dir_ / "model.safetensors");
  Weights("model-00002-of-00002.safetensors", 64);
  Weights("model-00001-of-00002.safetensors", 64);
  Weights("stray.safetensors", 64);  // not in the index: not part of the model
  Text("model.safetensors.index.json",
       R"({"weight_map": {"w": "model-00002-of-00002.safetensors",
                          "v": "model-00001-of-00002.safetensors"}})");
  auto m = ModelFiles::Locate(dir_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->weights, (std::vector<fs::path>{dir_ / "model-00001-of-00002.safetensors",
                                               dir_ / "model-00002-of-00002.safetensors"}));
  Text("model.safetensors.index.json", R"({"weight_map": {"w": "gone.safetensors"}})");
  m = ModelFiles::Locate(dir_);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("gone.safetensors"));
  Text("model.safetensors.index.json", R"({"weight_map": 3})");
  m = ModelFiles::Locate(dir_);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("model.safetensors.index.json"));
}

TEST_F(ModelFilesTest, MissingPartsAreNamed) {
  EXPECT_EQ(ModelFiles::Locate(dir_ / "nope").status().code(), StatusCode::kNotFound);
  fs::remove(dir_ / "model.safetensors");
  auto m = ModelFiles::Locate(dir_);
  EXPECT_THAT(m.status().message(), HasSubstr("no *.safetensors"));
  fs::remove(dir_ / "tokenizer.json");
  m = ModelFiles::Locate(dir_);
  EXPECT_THAT(m.status().message(), HasSubstr((dir_ / "tokenizer.json").string()));
  fs::remove(dir_ / "config.json");
  m = ModelFiles::Locate(dir_);
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr((dir_ / "config.json").string()));
}

TEST_F(ModelFilesTest, FingerprintIsStableAndFormatted) {
  std::string a = Fp();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(Fp(), a);
}

TEST_F(ModelFilesTest, FingerprintIgnoresConfigFormattingAndGenerationConfig) {
  std::string a = Fp();
  Text("config.json", "{\n  \"a\": [1, 2],\n  \"b\": 1\n}\n");
  Text("generation_config.json", R"({"temperature": 0.7})");
  Text("tokenizer_config.json", R"({"chat_template": "x"})");
  EXPECT_EQ(Fp(), a);
}

TEST_F(ModelFilesTest, FingerprintChangesWithEachPart) {
  std::string base = Fp();
  Text("config.json", R"({"b": 2, "a": [1, 2]})");
  EXPECT_NE(Fp(), base);
  Text("config.json", R"({"b": 1, "a": [1, 2]})");
  EXPECT_EQ(Fp(), base);

  Text("tokenizer.json", R"({"model": {"x": 1}})");
  EXPECT_NE(Fp(), base);
  Text("tokenizer.json", R"({"model": {}})");
  EXPECT_EQ(Fp(), base);

  Flip("model.safetensors", 100);  // inside the header
  EXPECT_NE(Fp(), base);
  Flip("model.safetensors", 100);
  EXPECT_EQ(Fp(), base);
  Flip("model.safetensors", 200000);  // first MiB of data
  EXPECT_NE(Fp(), base);
  Flip("model.safetensors", 200000);
  Flip("model.safetensors", -1);  // last byte
  EXPECT_NE(Fp(), base);
  Flip("model.safetensors", -1);
  EXPECT_EQ(Fp(), base);

  fs::rename(dir_ / "model.safetensors", dir_ / "other.safetensors");
  EXPECT_NE(Fp(), base);
}

TEST_F(ModelFilesTest, FingerprintErrors) {
  auto m = ModelFiles::Locate(dir_);
  ASSERT_TRUE(m.ok());
  Text("config.json", "{oops");
  auto fp = m->Fingerprint();
  ASSERT_FALSE(fp.ok());
  EXPECT_THAT(fp.status().message(), HasSubstr("config.json"));
  Text("config.json", "{}");
  fs::remove(dir_ / "model.safetensors");
  fp = m->Fingerprint();
  ASSERT_FALSE(fp.ok());
  EXPECT_THAT(fp.status().message(), HasSubstr("model.safetensors"));
  fs::remove(dir_ / "tokenizer.json");
  fp = m->Fingerprint();
  ASSERT_FALSE(fp.ok());
  EXPECT_THAT(fp.status().message(), HasSubstr("tokenizer.json"));
}

}  // namespace
}  // namespace agentkv::model
