#include "engine/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/model/safetensors_file.h"
#include "engine/model/safetensors_writer.h"

namespace agentkv::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::string Bytes(size_t n, uint8_t start) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(start + i * 7);
  return s;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A file with exactly this header text and data section.
  fs::path Raw(const std::string& name, const std::string& header, const std::string& data) {
    fs::path p = dir_ / name;
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header << data;
    return p;
  }
  void WriteText(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::vector<SafetensorsWriter::Tensor> TwoTensors() {
    return {{"a.weight", TensorDtype::kBF16, {2, 3}, Bytes(12, 1)},
            {"b.bias", TensorDtype::kF32, {5}, Bytes(20, 50)}};
  }
  // Error from opening a raw file whose header is `header`.
  Status OpenRawError(const std::string& header, const std::string& data) {
    fs::path p = Raw("bad.safetensors", header, data);
    auto f = SafetensorsFile::Open(p);
    return f.ok() ? Status::Ok() : f.status();
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, WriteThenReadBack) {
  fs::path p = dir_ / "m.safetensors";
  ASSERT_TRUE(SafetensorsWriter::WriteFile(p, TwoTensors()).ok());
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
  auto f = SafetensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->data_offset() % 8, 0u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->file_size(), (*f)->data_offset() + 32);
  auto a = (*f)->Get("a.weight");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->dtype, TensorDtype::kBF16);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->numel(), 6);
  ASSERT_EQ(a->nbytes, 12u);
  EXPECT_EQ(std::string(static_cast<const char*>(a->data), 12), Bytes(12, 1));
  auto b = (*f)->Get("b.bias");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, TensorDtype::kF32);
  EXPECT_EQ(std::string(static_cast<const char*>(b->data), 20), Bytes(20, 50));
}

TEST_F(SafetensorsTest, OnDiskLayoutFollowsTheFormat) {
  fs::path p = dir_ / "m.safetensors";
  ASSERT_TRUE(SafetensorsWriter::WriteFile(p, TwoTensors()).ok());
  std::ifstream in(p, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(all[i]);
  ASSERT_LE(8 + n, all.size());
  EXPECT_EQ((8 + n) % 8, 0u);
  std::string header = all.substr(8, n);
  // Padding is trailing spaces, which JSON parsers accept.
  EXPECT_NE(header.find_last_not_of(' '), std::string::npos);
  json h = json::parse(header);
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(h["a.weight"]["dtype"], "BF16");
  EXPECT_EQ(h["a.weight"]["data_offsets"], json({0, 12}));
  EXPECT_EQ(h["b.bias"]["data_offsets"], json({12, 32}));
  EXPECT_EQ(all.substr(8 + n), Bytes(12, 1) + Bytes(20, 50));
}

TEST_F(SafetensorsTest, StreamingWriterAcceptsAnyChunking) {
  fs::path p = dir_ / "s.safetensors";
  SafetensorsWriter w(p);
  ASSERT_TRUE(w.Add("x", TensorDtype::kF16, {3, 3}).ok());
  ASSERT_TRUE(w.Add("y", TensorDtype::kF32, {}).ok());  // scalar
  ASSERT_TRUE(w.Begin().ok());
  EXPECT_EQ(w.data_bytes(), 22u);
  std::string data = Bytes(22, 9);
  for (size_t i = 0; i < data.size(); i += 5)
    ASSERT_TRUE(w.Append(data.data() + i, std::min<size_t>(5, data.size() - i)).ok());
  ASSERT_TRUE(w.Finish().ok());
  auto st = Safetensors::Open(p);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto y = st->Get("y", {});
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(std::string(static_cast<const char*>(y->data), 4), data.substr(18));
}

TEST_F(SafetensorsTest, WriterMisuseIsReported) {
  fs::path p = dir_ / "w.safetensors";
  {
    SafetensorsWriter w(p);
    ASSERT_TRUE(w.Add("x", TensorDtype::kF32, {2}).ok());
    EXPECT_FALSE(w.Add("x", TensorDtype::kF32, {2}).ok());
    EXPECT_FALSE(w.Add("", TensorDtype::kF32, {2}).ok());
    EXPECT_FALSE(w.Add("__metadata__", TensorDtype::kF32, {2}).ok());
    EXPECT_FALSE(w.Add("neg", TensorDtype::kF32, {-1}).ok());
    EXPECT_FALSE(w.Append("abcd", 4).ok());  // before Begin
    EXPECT_FALSE(w.Finish().ok());
    ASSERT_TRUE(w.Begin().ok());
    EXPECT_FALSE(w.Begin().ok());
    EXPECT_FALSE(w.Add("late", TensorDtype::kF32, {1}).ok());
    EXPECT_THAT(w.Append(Bytes(12, 0).data(), 12).message(), HasSubstr("more tensor data"));
    ASSERT_TRUE(w.Append("abcd", 4).ok());
    Status st = w.Finish();
    EXPECT_THAT(st.message(), HasSubstr("only 4 of 8"));
    EXPECT_TRUE(fs::exists(p.string() + ".tmp"));
  }
  // An unfinished writer leaves neither the file nor its temporary.
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p.string() + ".tmp"));

  auto bad = TwoTensors();
  bad[1].bytes.pop_back();
  Status st = SafetensorsWriter::WriteFile(p, bad);
  EXPECT_THAT(st.message(), HasSubstr("b.bias"));
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(SafetensorsTest, WriterReportsUnwritableDirectory) {
  SafetensorsWriter w(dir_ / "no_such_dir" / "x.safetensors");
  ASSERT_TRUE(w.Add("x", TensorDtype::kF32, {1}).ok());
  Status st = w.Begin();
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_THAT(st.message(), HasSubstr("no_such_dir"));
}

TEST_F(SafetensorsTest, CheckedGetNamesFileAndTensor) {
  fs::path p = dir_ / "m.safetensors";
  ASSERT_TRUE(SafetensorsWriter::WriteFile(p, TwoTensors()).ok());
  auto st = Safetensors::Open(p);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->Get("a.weight", {2, 3}).ok());
  auto r = st->Get("a.weight", {3, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(p.string()));
  EXPECT_THAT(r.status().message(), HasSubstr("a.weight"));
  EXPECT_THAT(r.status().message(), HasSubstr("[2, 3]"));
  EXPECT_THAT(r.status().message(), HasSubstr("[3, 2]"));
  auto missing = st->Get("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));
  EXPECT_THAT(missing.status().message(), HasSubstr(p.string()));
  EXPECT_FALSE(st->Has("nope"));
  EXPECT_EQ(st->Names(), (std::vector<std::string>{"a.weight", "b.bias"}));
  EXPECT_EQ(st->FileOf("b.bias"), p);
  EXPECT_TRUE(st->FileOf("nope").empty());
}

TEST_F(SafetensorsTest, UnsupportedDtypeOpensButGetFails) {
  std::string header = R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
  fs::path p = Raw("i64.safetensors", header, Bytes(20, 0));
  auto st = Safetensors::Open(p);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(st->Get("w").ok());
  auto r = st->Get("ids");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(p.string()));
  EXPECT_THAT(r.status().message(), HasSubstr("ids"));
  EXPECT_THAT(r.status().message(), HasSubstr("I64"));
}

TEST_F(SafetensorsTest, TruncatedFileIsCorruptionNamingFileAndTensor) {
  fs::path p = dir_ / "m.safetensors";
  ASSERT_TRUE(SafetensorsWriter::WriteFile(p, TwoTensors()).ok());
  fs::resize_file(p, fs::file_size(p) - 3);
  auto f = SafetensorsFile::Open(p);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(f.status().message(), HasSubstr(p.string()));
  EXPECT_THAT(f.status().message(), HasSubstr("b.bias"));
  EXPECT_THAT(f.status().message(), HasSubstr("truncated"));

  // Cut inside the header: the header length points past the end.
  fs::resize_file(p, 20);
  f = SafetensorsFile::Open(p);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(f.status().message(), HasSubstr(p.string()));
  EXPECT_THAT(f.status().message(), HasSubstr("header length"));

  fs::resize_file(p, 5);
  f = SafetensorsFile::Open(p);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(f.status().message(), HasSubstr("truncated"));
}

TEST_F(SafetensorsTest, BadHeadersAreCorruption) {
  struct Case {
    std::string header;
    size_t data;
    const char* want;
  };
  const Case cases[] = {
      {"{not json", 0, "not valid JSON"},
      {"[1, 2]", 0, "not a JSON object"},
      {R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4, "t: missing dtype"},
      {R"({"t":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", 4, "unknown dtype Q4"},
      {R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "bad shape"},
      {R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 4, "missing shape"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "data_offsets"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8, "needs 8"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 8, "reversed"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "overlaps"},
      {R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4,
       "too large"},
      {R"({"__metadata__":[1]})", 0, "__metadata__"},
      {R"({"t":5})", 0, "not an object"},
  };
  for (const Case& c : cases) {
    Status st = OpenRawError(c.header, Bytes(c.data, 0));
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << c.header;
    EXPECT_THAT(st.message(), HasSubstr("bad.safetensors")) << c.header;
    EXPECT_THAT(st.message(), HasSubstr(c.want)) << c.header;
  }
  // A header length far beyond the file.
  fs::path p = dir_ / "huge.safetensors";
  {
    std::ofstream out(p, std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(0x7f));
    out << "{}";
  }
  auto f = SafetensorsFile::Open(p);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("header length"));
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  auto f = Safetensors::Open(dir_ / "absent.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), HasSubstr("absent.safetensors"));
  auto d = Safetensors::Open(dir_);  // empty directory
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, ShardedWithIndex) {
  auto t = TwoTensors();
  ASSERT_TRUE(SafetensorsWriter::WriteFile(dir_ / "model-00001-of-00002.safetensors", {t[0]}).ok());
  ASSERT_TRUE(SafetensorsWriter::WriteFile(dir_ / "model-00002-of-00002.safetensors", {t[1]}).ok());
  WriteText("model.safetensors.index.json",
            R"({"metadata": {"total_size": 32}, "weight_map": {
                 "a.weight": "model-00001-of-00002.safetensors",
                 "b.bias": "model-00002-of-00002.safetensors"}})");
  for (const fs::path& open_path : {dir_, dir_ / "model.safetensors.index.json"}) {
    auto st = Safetensors::Open(open_path);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->files().size(), 2u);
    EXPECT_EQ(st->FileOf("b.bias"), dir_ / "model-00002-of-00002.safetensors");
    auto b = st->Get("b.bias", {5});
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(std::string(static_cast<const char*>(b->data), 20), Bytes(20, 50));
    auto bad = st->Get("b.bias", {4});
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(bad.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
  }
}

TEST_F(SafetensorsTest, ShardsWithoutIndex) {
  auto t = TwoTensors();
  ASSERT_TRUE(SafetensorsWriter::WriteFile(dir_ / "x1.safetensors", {t[0]}).ok());
  ASSERT_TRUE(SafetensorsWriter::WriteFile(dir_ / "x2.safetensors", {t[1]}).ok());
  auto st = Safetensors::Open(dir_);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(st->Has("a.weight") && st->Has("b.bias"));

  // The same tensor in two files is ambiguous.
  ASSERT_TRUE(SafetensorsWriter::WriteFile(dir_ / "x3.safetensors", {t[1]}).ok());
  auto dup = Safetensors::Open(dir_);
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(dup.status().message(), HasSubstr("b.bias"));
  EXPECT_THAT(dup.status().message(), HasSubstr("x3.safetensors"));
}

TEST_F(SafetensorsTest, BadIndexes) {
  auto t = TwoTensors();
  ASSERT_TRUE(SafetensorsWriter::WriteFile(dir_ / "s1.safetensors", {t[0]}).ok());
  const fs::path index = dir_ / "model.safetensors.index.json";

  WriteText(index.filename(), R"({"weight_map": {"b.bias": "s1.safetensors"}})");
  auto r = Safetensors::Open(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(r.status().message(), HasSubstr("b.bias"));
  EXPECT_THAT(r.status().message(), HasSubstr("s1.safetensors"));

  WriteText(index.filename(), R"({"weight_map": {"a.weight": "gone.safetensors"}})");
  r = Safetensors::Open(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("gone.safetensors"));

  WriteText(index.filename(), R"({"weight_map": {"a.weight": "../s1.safetensors"}})");
  r = Safetensors::Open(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("outside"));

  WriteText(index.filename(), R"({"metadata": {}})");
  r = Safetensors::Open(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("weight_map"));
  EXPECT_THAT(r.status().message(), HasSubstr("model.safetensors.index.json"));

  WriteText(index.filename(), "{");
  r = Safetensors::Open(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not valid JSON"));

  WriteText(index.filename(), R"({"weight_map": {"a.weight": 3}})");
  r = Safetensors::Open(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("a.weight"));
}

TEST(TensorDtypeTest, NamesAndSizes) {
  for (TensorDtype d : {TensorDtype::kBF16, TensorDtype::kF16, TensorDtype::kF32}) {
    auto parsed = ParseTensorDtype(TensorDtypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(TensorDtypeSize(TensorDtype::kBF16), 2u);
  EXPECT_EQ(TensorDtypeSize(TensorDtype::kF32), 4u);
  EXPECT_EQ(TensorDtypeTorchName(TensorDtype::kF16), "float16");
  EXPECT_FALSE(ParseTensorDtype("F64").ok());
  EXPECT_EQ(ShapeString({}), "[]");
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({3, 0}), 0);
}

}  // namespace
}  // namespace agentkv::model
