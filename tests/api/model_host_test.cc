// ModelHost: hot-swap between the default model and a second synthesized
// one, with one store: fingerprints change and come back, a bad directory
// leaves the old model serving, Shutdown stops admitting.
#include "api/model_host.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>

#include <gtest/gtest.h>

#include "engine/model/model_synth.h"

namespace agentkv::api {
namespace {

namespace fs = std::filesystem;

TEST(ModelHostTest, SwapsAndSwapsBack) {
  const fs::path dir = fs::path(AGENTKV_DATA_DIR) / "models/default";
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << "default model missing";
  std::string tmpl = (fs::temp_directory_path() / "agentkv_host_XXXXXX").string();
  const fs::path tmp = ::mkdtemp(tmpl.data());
  model::SynthOptions so;
  so.arch = "qwen3";
  so.tokenizer_dir = fs::path(AGENTKV_DATA_DIR) / "tokenizers/qwen3";
  so.out_dir = tmp / "small";
  so.layers = 1;
  so.hidden = 32;
  so.heads = 2;
  so.kv_heads = 1;
  so.seed = 3;
  ASSERT_TRUE(model::SynthesizeModel(so).ok());
  fs::create_directories(tmp / "store");
  store::StoreOptions sopt;
  sopt.sync = false;
  auto st = store::AgentStore::Open((tmp / "store").string(), sopt);
  ASSERT_TRUE(st.ok()) << st.status().ToString();

  ServedModelOptions o;
  o.model_dir = dir.string();
  o.backend.threads = 1;
  o.store = st->get();
  auto m = ServedModel::Load(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ModelHost host(o, std::move(m).value());
  const std::string fp_a = host.Current()->fingerprint();
  std::weak_ptr<ServedModel> old = host.Current();

  auto r = host.Swap(so.out_dir.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->old_fingerprint, fp_a);
  EXPECT_NE(r->new_fingerprint, fp_a);
  EXPECT_EQ(r->new_model, "small");
  EXPECT_TRUE(r->warning.empty()) << r->warning;
  EXPECT_TRUE(old.expired());  // nothing held the old model: its weights are gone
  EXPECT_EQ(host.Current()->name(), "small");
  EXPECT_EQ(host.swaps(), 1);
  // The new engine serves.
  engine::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 2;
  auto h = host.Current()->Submit({1, 2, 3}, sp, engine::Priority::kNormal);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  while (h->stream->Pop().kind == engine::RequestOutput::Kind::kDelta) {
  }

  // A directory that is no model: an error, and the current model serves on.
  auto bad = host.Swap((tmp / "nothing").string());
  EXPECT_FALSE(bad.ok());
  ASSERT_NE(host.Current(), nullptr);
  EXPECT_EQ(host.Current()->name(), "small");

  r = host.Swap(dir.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(host.Current()->fingerprint(), fp_a);
  EXPECT_EQ(host.swaps(), 2);

  // Swaps on the host's worker: one at a time, and Shutdown joins a swap
  // under way (nothing it uses is destroyed under it).
  std::atomic<int> done{0};
  std::atomic<bool> ok{false};
  ASSERT_TRUE(host.StartSwap(so.out_dir.string(), [&](Result<ModelHost::SwapReport> rep) {
    ok = rep.ok();
    ++done;
  }));
  EXPECT_FALSE(host.StartSwap(dir.string(), [&](auto) { ++done; }));  // busy: refused
  EXPECT_TRUE(host.Shutdown().ok());
  EXPECT_EQ(done.load(), 1);  // the swap finished before Shutdown returned
  EXPECT_TRUE(ok.load());
  EXPECT_EQ(host.Current(), nullptr);
  EXPECT_EQ(host.Swap(dir.string()).status().code(), StatusCode::kCancelled);
  st->reset();
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace agentkv::api
