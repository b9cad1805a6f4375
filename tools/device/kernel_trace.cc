// CUPTI injection library: records every kernel's start and end (graph
// kernels included) and writes them, sorted by start, to $KT_OUT at exit.
// A development tool for the GPU machine, not part of the build:
//   g++ -O2 -shared -fPIC -std=c++17 -I/usr/local/cuda/include \
//     tools/device/kernel_trace.cc -o kt.so -L<cupti dir> -lcupti
//   CUDA_INJECTION64_PATH=$PWD/kt.so KT_OUT=/tmp/kt.txt agentkv bench ...
// Each line: start_ns end_ns graph_id grid_x grid_y grid_z name; copies
// are named memcpy<CUpti_ActivityMemcpyKind> (1: to the device, 2: to
// the host) with their bytes and stream id in place of the grid. Kernel
// activity of this kind keeps kernels concurrent (programmatic launches
// still overlap), at some cost per kernel.
#include <cupti.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Rec {
  uint64_t start, end;
  uint32_t graph;
  int gx, gy, gz;
  std::string name;
};

std::mutex mu;
std::vector<Rec> recs;

void CUPTIAPI Requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI Completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      // Copies as "memcpy<kind>" lines (grid: bytes, stream, 0), so the
      // gaps between steps show what fills them.
      auto* c = reinterpret_cast<CUpti_ActivityMemcpy6*>(r);
      recs.push_back({c->start, c->end, c->graphId, static_cast<int>(c->bytes),
                      static_cast<int>(c->streamId), 0,
                      "memcpy" + std::to_string(static_cast<int>(c->copyKind))});
      continue;
    }
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(r);
    std::string n = k->name ? k->name : "?";
    recs.push_back({k->start, k->end, k->graphId, k->gridX, k->gridY, k->gridZ, n});
  }
  free(buffer);
}

void Dump() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("KT_OUT");
  FILE* f = std::fopen(path ? path : "kt.txt", "w");
  if (!f) return;
  std::lock_guard<std::mutex> lock(mu);
  std::sort(recs.begin(), recs.end(), [](const Rec& a, const Rec& b) { return a.start < b.start; });
  for (const Rec& r : recs)
    std::fprintf(f, "%llu %llu %u %d %d %d %s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.graph, r.gx, r.gy, r.gz, r.name.c_str());
  std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection() {
  cuptiActivityRegisterCallbacks(Requested, Completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  std::atexit(Dump);
  return 1;
}
