// agentkv logits --model DIR --ids 1,2,3: the final position's logits as JSON.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_options.h"

namespace agentkv::cli {
namespace {

int RunLogits(const ModelOptions& mo, const std::string& ids_text) {
  std::vector<int32_t> ids;
  std::string err;
  if (!ParseIds(ids_text, ids, err)) {
    std::cerr << "error: " << err << "\n";
    return 2;
  }
  auto backend = backend::CreateBackend(mo.model_dir, mo.backend);
  if (!backend.ok()) {
    std::cerr << "error: " << backend.status().ToString() << "\n";
    return 1;
  }
  backend::Backend& b = **backend;
  const int bs = 16;
  backend::KvLayout layout;
  layout.block_size = bs;
  const cache::ModelCacheSpec& spec = b.cache_spec();
  std::array<std::vector<int32_t>, backend::kMaxCacheGroups> tables;
  backend::SeqStep st;
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    const int n = spec.BlocksFor(static_cast<int>(g), ids.size(), bs);
    layout.blocks_per_group[g] = n;
    for (int i = 0; i < n; ++i) tables[g].push_back(i);
    st.block_tables[g] = tables[g];
  }
  Status s = b.AllocateKv(layout);
  std::vector<float> logits(b.config().vocab_size);
  st.tokens = ids;
  st.want_logits = true;
  if (s.ok()) s = b.Forward({&st, 1}, logits);
  if (!s.ok()) {
    std::cerr << "error: " << s.ToString() << "\n";
    return 1;
  }
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < logits.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.9g", i ? "," : "", logits[i]);
    out += buf;
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

Registrar reg("logits", "Print the final position's logits for token ids as a JSON array",
              [](CLI::App& app) -> Runner {
                auto mo = std::make_shared<ModelOptions>();
                auto ids = std::make_shared<std::string>();
                mo->Add(app);
                app.add_option("--ids", *ids, "Comma-separated token ids")->required();
                return [mo, ids] { return RunLogits(*mo, *ids); };
              });

}  // namespace
}  // namespace agentkv::cli
