// TenantKeys: the `--api-keys FILE` table, API key -> tenant. One entry a
// line: `KEY TENANT [high]`, blank lines and lines starting with '#'
// ignored; `high` lets the tenant's requests ask for `X-Priority: high`
// (others are served at normal priority at most). Tenant names are 1 to 64
// of [A-Za-z0-9_.-], so a tenant-scoped agent id ("TENANT/ID") splits at
// its first '/'. A key appears once; keys are at least 16 bytes.
//
// Lookup compares the presented key with every key in constant time
// (api/api_key.h), so the response time tells nothing of the keys.
//
// Thread-safety: immutable after Parse / Load; share it as
// shared_ptr<const TenantKeys> and swap the pointer to reload.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace agentkv::api {

struct Tenant {
  std::string name;
  bool high_priority = false;  // may ask for X-Priority: high
};

class TenantKeys {
 public:
  // InvalidArgument naming the line on a malformed entry, a bad tenant
  // name, a short or repeated key.
  static Result<std::shared_ptr<const TenantKeys>> Parse(std::string_view text);
  // Parse of the file's contents; IoError when it cannot be read.
  static Result<std::shared_ptr<const TenantKeys>> Load(const std::string& path);

  // The tenant whose key `presented` is; null when none is.
  const Tenant* Find(std::string_view presented) const;
  size_t size() const { return entries_.size(); }

  static bool ValidTenantName(std::string_view name);

 private:
  struct Entry {
    std::string key;
    Tenant tenant;
  };
  std::vector<Entry> entries_;
};

}  // namespace agentkv::api
