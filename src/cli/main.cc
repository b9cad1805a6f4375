#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>

#include "cli/command.h"

namespace agentkv::cli {
std::vector<Command>& Registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace agentkv::cli

int main(int argc, char** argv) {
  using namespace agentkv::cli;
  // NVLink multicast stays off for NCCL (tensor parallelism) unless the
  // user set it: on the lent machines it can take the host's GPUs out of
  // service. NCCL reads it when it makes its first communicator; the model
  // options pass the value down (cuda::NcclOptions), which refuses none.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  CLI::App app{"agentkv: a persistent multi-agent LLM session server"};
  app.require_subcommand(1);
  std::map<std::string, CLI::App*> groups;  // "model" -> its App, for "model synth"
  std::vector<std::pair<CLI::App*, Runner>> runners;
  for (auto& cmd : Registry()) {
    CLI::App* parent = &app;
    std::string leaf = cmd.name;
    if (auto sp = cmd.name.find(' '); sp != std::string::npos) {
      std::string group = cmd.name.substr(0, sp);
      leaf = cmd.name.substr(sp + 1);
      auto it = groups.find(group);
      if (it == groups.end()) {
        CLI::App* g = app.add_subcommand(group, group + " commands");
        g->require_subcommand(1);
        it = groups.emplace(group, g).first;
      }
      parent = it->second;
    }
    CLI::App* sub = parent->add_subcommand(leaf, cmd.description);
    runners.emplace_back(sub, cmd.setup(*sub));
  }
  CLI11_PARSE(app, argc, argv);
  for (auto& [sub, run] : runners)
    if (sub->parsed()) return run();
  return 2;
}
