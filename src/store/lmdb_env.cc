#include "store/lmdb_env.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace agentkv::store {
namespace {

MDB_val ToVal(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }
std::string_view FromVal(const MDB_val& v) {
  return {static_cast<const char*>(v.mv_data), v.mv_size};
}

constexpr const char* kDbNames[kDbCount] = {"meta", "agents", "history", "chains",
                                            "kv",   "kvmeta", "models"};

}  // namespace

const char* DbName(Db db) { return kDbNames[static_cast<int>(db)]; }

Status LmdbStatus(int rc, std::string_view context) {
  if (rc == MDB_SUCCESS) return Status::Ok();
  std::string msg = std::string(context) + ": " + mdb_strerror(rc);
  switch (rc) {
    case MDB_NOTFOUND:
    case ENOENT:
      return NotFound(std::move(msg));
    case MDB_MAP_FULL:
    case MDB_READERS_FULL:
    case MDB_TXN_FULL:
    case MDB_DBS_FULL:
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case ENOMEM:
      return ResourceExhausted(std::move(msg));
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE:
      return Corruption(std::move(msg));
    case MDB_BAD_VALSIZE:
    case EINVAL:
      return InvalidArgument(std::move(msg));
    default:
      return IoError(std::move(msg));
  }
}

Result<std::unique_ptr<LmdbEnv>> LmdbEnv::Open(const std::string& dir, const LmdbOptions& options) {
  std::unique_ptr<LmdbEnv> env(new LmdbEnv());
  env->dir_ = dir;
  env->options_ = options;
  std::error_code ec;
  if (options.read_only) {
    if (!std::filesystem::exists(std::filesystem::path(dir) / "data.mdb", ec)) {
      return NotFound("no store in " + dir);
    }
  } else {
    std::filesystem::create_directories(dir, ec);
    if (ec) return IoError("create store directory " + dir + ": " + ec.message());
  }
  // store.lock keeps compaction from swapping the file under a live process.
  const std::string lock_path = dir + "/store.lock";
  env->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (env->lock_fd_ < 0 && options.read_only) {
    env->lock_fd_ = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (env->lock_fd_ < 0) return LmdbStatus(errno, "open " + lock_path);
  if (::flock(env->lock_fd_, (options.exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    return IoError("store " + dir + " is in use" +
                   (options.exclusive ? " (close the server first)" : " (being compacted)"));
  }

  int rc = mdb_env_create(&env->env_);
  if (rc != 0) return LmdbStatus(rc, "mdb_env_create");
  if ((rc = mdb_env_set_maxdbs(env->env_, kDbCount + 1)) != 0 ||
      (rc = mdb_env_set_maxreaders(env->env_, 512)) != 0 ||
      (rc = mdb_env_set_mapsize(env->env_, options.initial_map_bytes)) != 0) {
    return LmdbStatus(rc, "configure LMDB");
  }
  unsigned flags = MDB_NOTLS;
  if (!options.sync) flags |= MDB_NOSYNC;
  if (options.read_only) flags |= MDB_RDONLY;
  rc = mdb_env_open(env->env_, dir.c_str(), flags, 0644);
  if (rc != 0) return LmdbStatus(rc, "open store " + dir);
  MDB_envinfo info;
  mdb_env_info(env->env_, &info);
  env->map_size_ = info.me_mapsize;

  MDB_txn* txn = nullptr;
  rc = mdb_txn_begin(env->env_, nullptr, options.read_only ? MDB_RDONLY : 0, &txn);
  if (rc != 0) return LmdbStatus(rc, "open store " + dir);
  for (int i = 0; i < kDbCount; ++i) {
    rc = mdb_dbi_open(txn, kDbNames[i], options.read_only ? 0 : MDB_CREATE, &env->dbis_[i]);
    if (rc != 0) {
      mdb_txn_abort(txn);
      if (rc == MDB_NOTFOUND) return NotFound(dir + " is not an agentkv store");
      return LmdbStatus(rc, std::string("open sub-database ") + kDbNames[i]);
    }
  }
  rc = mdb_txn_commit(txn);
  if (rc != 0) return LmdbStatus(rc, "open store " + dir);
  return env;
}

LmdbEnv::~LmdbEnv() {
  if (env_ != nullptr) mdb_env_close(env_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Result<LmdbEnv::ReadTxn> LmdbEnv::BeginRead() {
  for (int attempt = 0;; ++attempt) {
    std::shared_lock lock(resize_mu_);
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
    if (rc == MDB_MAP_RESIZED && attempt < 3) {
      lock.unlock();
      RETURN_IF_ERROR(AdoptMapSize());
      continue;
    }
    if (rc != 0) return LmdbStatus(rc, "begin read transaction");
    return ReadTxn(this, txn, std::move(lock));
  }
}

Status LmdbEnv::AdoptMapSize() {
  std::unique_lock lock(resize_mu_);
  int rc = mdb_env_set_mapsize(env_, 0);
  if (rc != 0) return LmdbStatus(rc, "adopt map size");
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
  return Status::Ok();
}

Status LmdbEnv::Grow(uint64_t seen_size) {
  std::unique_lock lock(resize_mu_);
  const uint64_t current = map_size_.load();
  if (current != seen_size) return Status::Ok();  // another writer grew it
  if (current >= options_.max_map_bytes) {
    return ResourceExhausted(
        "store map is full at " + std::to_string(current) + " bytes, the maximum map size (" +
        std::to_string(options_.max_map_bytes) + "); raise the maximum or lower --store-max-bytes");
  }
  const uint64_t next = std::min(current * 2, options_.max_map_bytes);
  int rc = mdb_env_set_mapsize(env_, next);
  if (rc != 0) return LmdbStatus(rc, "grow store map to " + std::to_string(next));
  MDB_envinfo info;
  mdb_env_info(env_, &info);
  map_size_ = info.me_mapsize;
  return Status::Ok();
}

Status LmdbEnv::WriteAs(const std::function<Status(WriteTxn&)>& fn, bool background) {
  if (options_.read_only) return InvalidArgument("store " + dir_ + " is open read-only");
  if (background) {
    std::unique_lock<std::mutex> gate(gate_mu_);
    if (foreground_ > 0) {
      background_yields_.fetch_add(1);
      gate_cv_.wait(gate, [&] { return foreground_ == 0; });
    }
  } else {
    std::lock_guard<std::mutex> gate(gate_mu_);
    ++foreground_;
  }
  struct Leave {
    LmdbEnv* env;
    bool foreground;
    ~Leave() {
      if (!foreground) return;
      std::lock_guard<std::mutex> gate(env->gate_mu_);
      if (--env->foreground_ == 0) env->gate_cv_.notify_all();
    }
  } leave{this, !background};
  for (int resized = 0;;) {
    std::shared_lock lock(resize_mu_);
    const uint64_t seen = map_size_.load();
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, 0, &txn);
    if (rc == MDB_MAP_RESIZED && resized++ < 3) {
      lock.unlock();
      RETURN_IF_ERROR(AdoptMapSize());
      continue;
    }
    if (rc != 0) return LmdbStatus(rc, "begin write transaction");
    WriteTxn w(this, txn);
    Status s = fn(w);
    bool map_full = w.map_full_;
    if (s.ok()) {
      rc = mdb_txn_commit(txn);
      if (rc == 0) return Status::Ok();
      if (rc != MDB_MAP_FULL) return LmdbStatus(rc, "commit");
      map_full = true;
    } else {
      mdb_txn_abort(txn);
      if (!map_full) return s;
    }
    lock.unlock();
    RETURN_IF_ERROR(Grow(seen));
  }
}

Status LmdbEnv::CopyCompact(const std::string& dir) {
  std::shared_lock lock(resize_mu_);
  return LmdbStatus(mdb_env_copy2(env_, dir.c_str(), MDB_CP_COMPACT), "compacting copy to " + dir);
}

Result<std::optional<std::string_view>> LmdbTxnBase::Get(Db db, std::string_view key) const {
  MDB_val k = ToVal(key), v;
  int rc = mdb_get(txn_, env_->dbi(db), &k, &v);
  if (rc == MDB_NOTFOUND) return std::optional<std::string_view>();
  if (rc != 0) return LmdbStatus(rc, std::string("get from ") + DbName(db));
  return std::optional<std::string_view>(FromVal(v));
}

Status LmdbTxnBase::Scan(Db db, std::string_view prefix, const LmdbEnv::Visitor& visit,
                         std::string_view from) const {
  MDB_cursor* cur = nullptr;
  int rc = mdb_cursor_open(txn_, env_->dbi(db), &cur);
  if (rc != 0) return LmdbStatus(rc, std::string("open cursor on ") + DbName(db));
  std::unique_ptr<MDB_cursor, void (*)(MDB_cursor*)> guard(cur, mdb_cursor_close);
  const std::string_view seek = from.empty() ? prefix : from;
  MDB_val k = ToVal(seek), v;
  rc = seek.empty() ? mdb_cursor_get(cur, &k, &v, MDB_FIRST)
                    : mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
  while (rc == 0) {
    std::string_view key = FromVal(k);
    if (key.substr(0, prefix.size()) != prefix) return Status::Ok();
    ASSIGN_OR_RETURN(bool more, visit(key, FromVal(v)));
    if (!more) return Status::Ok();
    rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  }
  if (rc == MDB_NOTFOUND) return Status::Ok();
  return LmdbStatus(rc, std::string("scan ") + DbName(db));
}

Result<uint64_t> LmdbTxnBase::Count(Db db) const {
  MDB_stat st;
  int rc = mdb_stat(txn_, env_->dbi(db), &st);
  if (rc != 0) return LmdbStatus(rc, std::string("stat ") + DbName(db));
  return static_cast<uint64_t>(st.ms_entries);
}

Result<uint64_t> LmdbTxnBase::UsedBytes() const {
  uint64_t total = 0;
  for (int i = 0; i < kDbCount; ++i) {
    MDB_stat st;
    int rc = mdb_stat(txn_, env_->dbi(static_cast<Db>(i)), &st);
    if (rc != 0) return LmdbStatus(rc, "stat");
    total += uint64_t{st.ms_psize} * (st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages);
  }
  return total;
}

LmdbEnv::ReadTxn::ReadTxn(ReadTxn&& o) noexcept
    : LmdbTxnBase(o.env_, o.txn_), lock_(std::move(o.lock_)) {
  o.txn_ = nullptr;
}

LmdbEnv::ReadTxn::~ReadTxn() {
  if (txn_ != nullptr) mdb_txn_abort(txn_);
}

Status LmdbEnv::WriteTxn::Put(Db db, std::string_view key, std::string_view value) {
  MDB_val k = ToVal(key), v = ToVal(value);
  int rc = mdb_put(txn_, env_->dbi(db), &k, &v, 0);
  if (rc == MDB_MAP_FULL) map_full_ = true;
  return LmdbStatus(rc, std::string("put into ") + DbName(db));
}

Result<bool> LmdbEnv::WriteTxn::Del(Db db, std::string_view key) {
  MDB_val k = ToVal(key);
  int rc = mdb_del(txn_, env_->dbi(db), &k, nullptr);
  if (rc == MDB_NOTFOUND) return false;
  if (rc == MDB_MAP_FULL) map_full_ = true;
  if (rc != 0) return LmdbStatus(rc, std::string("delete from ") + DbName(db));
  return true;
}

}  // namespace agentkv::store
