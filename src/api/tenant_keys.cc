#include "api/tenant_keys.h"

#include <fstream>
#include <sstream>

#include "api/api_key.h"

namespace agentkv::api {

bool TenantKeys::ValidTenantName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Result<std::shared_ptr<const TenantKeys>> TenantKeys::Parse(std::string_view text) {
  auto keys = std::make_shared<TenantKeys>();
  std::istringstream in{std::string(text)};
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = "--api-keys line " + std::to_string(number);
    std::istringstream fields(line);
    std::string key, tenant, flag, extra;
    fields >> key;
    if (key.empty() || key[0] == '#') continue;
    fields >> tenant >> flag >> extra;
    if (tenant.empty()) return InvalidArgument(where + ": expected `KEY TENANT [high]`");
    if (!extra.empty() || (!flag.empty() && flag != "high")) {
      return InvalidArgument(where + ": expected `KEY TENANT [high]`");
    }
    if (key.size() < 16) return InvalidArgument(where + ": keys must be at least 16 bytes");
    if (!ValidTenantName(tenant)) {
      return InvalidArgument(where + ": tenant names are 1 to 64 of A-Z a-z 0-9 _ . -");
    }
    for (const Entry& e : keys->entries_) {
      if (e.key == key) return InvalidArgument(where + ": the key is listed already");
    }
    keys->entries_.push_back(Entry{key, Tenant{tenant, flag == "high"}});
  }
  return std::shared_ptr<const TenantKeys>(std::move(keys));
}

Result<std::shared_ptr<const TenantKeys>> TenantKeys::Load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError("cannot read --api-keys file " + path);
  std::stringstream buf;
  buf << f.rdbuf();
  if (f.bad()) return IoError("cannot read --api-keys file " + path);
  return Parse(buf.str());
}

const Tenant* TenantKeys::Find(std::string_view presented) const {
  // Every key is compared (no early exit), each in constant time.
  const Tenant* found = nullptr;
  for (const Entry& e : entries_) {
    if (KeysEqual(presented, e.key) && found == nullptr) found = &e.tenant;
  }
  return presented.empty() ? nullptr : found;
}

}  // namespace agentkv::api
