// agentkv store ls|show|rm|verify|compact --store DIR: inspect and maintain
// the persistent agent store. ls/show/verify open it read-only, so they may
// run beside a server; rm writes; compact needs the server stopped.
#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "store/agent_store.h"

namespace agentkv::cli {
namespace {

using store::AgentStore;
using store::StoreOptions;

std::string FormatTime(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Result<std::unique_ptr<AgentStore>> OpenStore(const std::string& dir, bool read_only) {
  StoreOptions o;
  o.read_only = read_only;
  return AgentStore::Open(dir, o);
}

int Fail(const Status& s) {
  std::cerr << "error: " << s.ToString() << "\n";
  return 1;
}

int RunLs(const std::string& dir) {
  auto s = OpenStore(dir, true);
  if (!s.ok()) return Fail(s.status());
  auto agents = (*s)->ListAgents();
  if (!agents.ok()) return Fail(agents.status());
  std::printf("%-40s %6s  %-20s  %s\n", "AGENT", "TURNS", "LAST USED",
              "KV (fingerprint: blocks, bytes)");
  for (const auto& a : *agents) {
    auto sum = (*s)->Summarize(a.id);
    std::string kv;
    if (sum.ok()) {
      for (const auto& u : sum->kv) {
        if (!kv.empty()) kv += "; ";
        kv += u.fp.Hex().substr(0, 12) + ": " + std::to_string(u.stored_blocks) + "/" +
              std::to_string(u.chain_blocks) + " blocks, " + std::to_string(u.stored_bytes) + " B";
      }
    } else {
      kv = sum.status().ToString();
    }
    std::printf("%-40s %6u  %-20s  %s\n", a.id.c_str(), a.turns, FormatTime(a.last_used_ms).c_str(),
                kv.empty() ? "-" : kv.c_str());
  }
  std::printf("%zu agents\n", agents->size());
  return 0;
}

int RunShow(const std::string& dir, const std::string& agent) {
  auto s = OpenStore(dir, true);
  if (!s.ok()) return Fail(s.status());
  auto sum = (*s)->Summarize(agent);
  if (!sum.ok()) return Fail(sum.status());
  nlohmann::json out = {{"agent_id", agent},
                        {"created", FormatTime(sum->meta.created_ms)},
                        {"last_used", FormatTime(sum->meta.last_used_ms)},
                        {"turns", sum->meta.turns},
                        {"system_prompt_hash", sum->meta.system_prompt_hash},
                        {"extras", sum->meta.extras}};
  for (const auto& u : sum->kv) {
    out["kv"].push_back({{"fingerprint", u.fp.Hex()},
                         {"chain_blocks", u.chain_blocks},
                         {"stored_blocks", u.stored_blocks},
                         {"stored_bytes", u.stored_bytes}});
  }
  auto history = (*s)->GetHistory(agent);
  if (!history.ok()) return Fail(history.status());
  for (const auto& t : *history) {
    out["history"].push_back(
        {{"turn", t.number}, {"messages", nlohmann::json::parse(t.messages_json, nullptr, false)}});
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

int RunRm(const std::string& dir, const std::string& agent) {
  auto s = OpenStore(dir, false);
  if (!s.ok()) return Fail(s.status());
  Status st = (*s)->RemoveAgent(agent);
  if (!st.ok()) return Fail(st);
  std::printf("removed agent %s\n", agent.c_str());
  return 0;
}

int RunVerify(const std::string& dir) {
  auto s = OpenStore(dir, true);
  if (!s.ok()) return Fail(s.status());
  auto rep = (*s)->Verify();
  if (!rep.ok()) return Fail(rep.status());
  for (const auto& p : rep->problems) std::printf("CORRUPT %s\n", p.c_str());
  std::printf(
      "%llu records checked, %llu KV blocks (%llu bytes stored, %llu uncompressed), "
      "%zu corrupt\n",
      static_cast<unsigned long long>(rep->records),
      static_cast<unsigned long long>(rep->kv_blocks),
      static_cast<unsigned long long>(rep->kv_stored_bytes),
      static_cast<unsigned long long>(rep->kv_uncompressed_bytes), rep->problems.size());
  return rep->ok() ? 0 : 1;
}

int RunCompact(const std::string& dir) {
  std::error_code ec;
  const auto before = std::filesystem::file_size(dir + "/data.mdb", ec);
  if (ec) return Fail(NotFound("no store in " + dir));
  Status st = AgentStore::Compact(dir);
  if (!st.ok()) return Fail(st);
  const auto after = std::filesystem::file_size(dir + "/data.mdb", ec);
  std::printf("compacted %s: %llu -> %llu bytes\n", dir.c_str(),
              static_cast<unsigned long long>(before), static_cast<unsigned long long>(after));
  return 0;
}

CLI::Option* AddStoreDir(CLI::App& app, std::shared_ptr<std::string> dir) {
  return app.add_option("--store", *dir, "Store directory")->required()->envname("AGENTKV_STORE");
}

Registrar ls("store ls", "List agents: turns, last use, stored KV per model fingerprint",
             [](CLI::App& app) -> Runner {
               auto dir = std::make_shared<std::string>();
               AddStoreDir(app, dir);
               return [dir] { return RunLs(*dir); };
             });

Registrar show("store show", "Print one agent's metadata and history as JSON",
               [](CLI::App& app) -> Runner {
                 auto dir = std::make_shared<std::string>();
                 auto agent = std::make_shared<std::string>();
                 AddStoreDir(app, dir);
                 app.add_option("agent,--agent", *agent, "Agent id")->required();
                 return [dir, agent] { return RunShow(*dir, *agent); };
               });

Registrar rm("store rm", "Remove an agent's history, KV chains and unshared KV blocks",
             [](CLI::App& app) -> Runner {
               auto dir = std::make_shared<std::string>();
               auto agent = std::make_shared<std::string>();
               AddStoreDir(app, dir);
               app.add_option("agent,--agent", *agent, "Agent id")->required();
               return [dir, agent] { return RunRm(*dir, *agent); };
             });

Registrar verify("store verify",
                 "Check every record's version, checksum and decompression; exit 1 if any is "
                 "corrupt",
                 [](CLI::App& app) -> Runner {
                   auto dir = std::make_shared<std::string>();
                   AddStoreDir(app, dir);
                   return [dir] { return RunVerify(*dir); };
                 });

Registrar compact("store compact",
                  "Rewrite the data file compactly and swap it in (stop the server first)",
                  [](CLI::App& app) -> Runner {
                    auto dir = std::make_shared<std::string>();
                    AddStoreDir(app, dir);
                    return [dir] { return RunCompact(*dir); };
                  });

}  // namespace
}  // namespace agentkv::cli
