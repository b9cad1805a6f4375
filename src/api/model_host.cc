#include "api/model_host.h"

#include <chrono>

namespace agentkv::api {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

ModelHost::ModelHost(ServedModelOptions options, std::unique_ptr<ServedModel> model)
    : options_(std::move(options)), current_(std::move(model)) {}

ModelHost::~ModelHost() { JoinWorker(); }

void ModelHost::JoinWorker() {
  std::thread w;
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    w = std::move(worker_);
  }
  if (w.joinable()) w.join();
}

bool ModelHost::StartSwap(std::string model_dir, SwapDone done) {
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (worker_busy_) return false;
  // The previous worker has finished (worker_busy_ is false): reap it.
  if (worker_.joinable()) worker_.join();
  worker_busy_ = true;
  worker_ = std::thread([this, dir = std::move(model_dir), done = std::move(done)] {
    Result<SwapReport> r = Swap(dir);
    if (done) done(std::move(r));
    std::lock_guard<std::mutex> lock(worker_mu_);
    worker_busy_ = false;
  });
  return true;
}

std::shared_ptr<ServedModel> ModelHost::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

int64_t ModelHost::swaps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return swaps_;
}

Status ModelHost::Retire(ServedModel& m, double drain_seconds, ShutdownTimes* times) {
  auto t = std::chrono::steady_clock::now();
  // Past the deadline, Stop below cuts the rest off, saving their KV.
  times->drained = m.engine().Drain(drain_seconds);
  times->drain_s = Since(t);
  t = std::chrono::steady_clock::now();
  // The engine persists every finished agent turn's blocks as it retires
  // them; Flush waits until those writes are durable.
  Status s;
  if (cache::KvTier* tier = m.kv_tier()) s = tier->Flush();
  times->flush_s = Since(t);
  t = std::chrono::steady_clock::now();
  m.engine().Stop();
  times->stop_s = Since(t);
  return s;
}

Result<ModelHost::SwapReport> ModelHost::Swap(const std::string& model_dir) {
  std::lock_guard<std::mutex> swap_lock(swap_mu_);
  std::shared_ptr<ServedModel> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::move(current_);  // stop admitting
  }
  if (!old) return Cancelled("the server is shutting down");
  SwapReport report;
  report.old_model = old->name();
  report.old_fingerprint = old->fingerprint();
  ShutdownTimes times;
  Status flushed = Retire(*old, options_.drain_seconds, &times);
  report.drain_s = times.drain_s;
  report.flush_s = times.flush_s;
  const std::string old_dir = options_.model_dir;
  old.reset();  // the weights and pool go with the last request holding them

  auto t = std::chrono::steady_clock::now();
  ServedModelOptions o = options_;
  o.model_dir = model_dir;
  auto loaded = ServedModel::Load(o);
  report.load_s = Since(t);
  if (!loaded.ok()) {
    Status why = loaded.status();
    auto back = ServedModel::Load(options_);
    std::lock_guard<std::mutex> lock(mu_);
    if (back.ok()) current_ = std::move(back).value();
    if (why.code() != StatusCode::kNotFound) why = InvalidArgument(why.message());
    return why.WithContext("cannot load " + model_dir);
  }
  options_ = o;
  std::lock_guard<std::mutex> lock(mu_);
  current_ = std::move(loaded).value();
  report.new_model = current_->name();
  report.new_fingerprint = current_->fingerprint();
  ++swaps_;
  if (!flushed.ok()) report.warning = "KV flush before the swap: " + flushed.ToString();
  return report;
}

Status ModelHost::Shutdown(ShutdownTimes* times) {
  JoinWorker();  // a swap under way finishes first (its reply included)
  std::lock_guard<std::mutex> swap_lock(swap_mu_);
  std::shared_ptr<ServedModel> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::move(current_);
  }
  if (!old) return Status::Ok();
  ShutdownTimes local;
  return Retire(*old, options_.drain_seconds, times ? times : &local);
}

}  // namespace agentkv::api
