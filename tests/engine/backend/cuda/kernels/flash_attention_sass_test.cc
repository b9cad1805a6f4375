// The machine code of the attention kernels as ptxas compiled it for sm_90,
// read from this test's own executable (the cubins nvcc embeds, not
// compressed): no GPU needed.
//
// Why: CUDA 13.0's ptxas compiled the L2-hinted cp.async of the head_dim
// 128 fp8 decode loop (MmaAttentionKernel<128, 1, Fp8KvLoader>) to an LDGSTS
// encoding that no other kernel of the project has (low opcode bits 0xdae
// where every other LDGSTS has 0xfae), and an H200 stopped on it with an
// illegal instruction the first time a split prefetched a third stage. The
// fp8 loader no longer passes the hint; the bf16 loader still does, and a
// change elsewhere may make ptxas choose that form again. This test fails
// on it before a GPU has to. (An encoding fact read off the cubins, not a
// documented one: see docs/kv-fp8.md.)
#include "../test_util.h"

#ifdef AGENTKV_HAVE_CUDA

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/backend/cuda/kernels/attention.h"

namespace agentkv::backend::cuda {
namespace {

struct AsyncCopy {
  std::string kernel;
  uint32_t opcode;  // the low 12 bits of the instruction
};

template <typename T>
T Read(const std::vector<uint8_t>& d, size_t at) {
  T v{};
  if (at + sizeof(T) <= d.size()) std::memcpy(&v, d.data() + at, sizeof(T));
  return v;
}

// Every LDGSTS (cp.async) of every function of every sm_90 cubin embedded in
// `exe`: ELF images with e_machine EM_CUDA (190) after the host one.
std::vector<AsyncCopy> AsyncCopies(const std::vector<uint8_t>& exe, int* cubins) {
  std::vector<AsyncCopy> out;
  *cubins = 0;
  static const uint8_t kMagic[4] = {0x7f, 'E', 'L', 'F'};
  for (size_t at = 1; at + 64 <= exe.size(); ++at) {
    if (std::memcmp(exe.data() + at, kMagic, 4) != 0 || exe[at + 4] != 2) continue;  // ELF64
    if (Read<uint16_t>(exe, at + 18) != 190) continue;
    ++*cubins;
    const uint64_t shoff = Read<uint64_t>(exe, at + 0x28);
    const uint16_t shentsize = Read<uint16_t>(exe, at + 0x3a);
    const uint16_t shnum = Read<uint16_t>(exe, at + 0x3c);
    const uint16_t shstrndx = Read<uint16_t>(exe, at + 0x3e);
    if (shentsize < 64 || shstrndx >= shnum) continue;
    auto section = [&](int i, uint32_t& name, uint64_t& off, uint64_t& size) {
      const size_t h = at + shoff + static_cast<size_t>(i) * shentsize;
      name = Read<uint32_t>(exe, h);
      off = Read<uint64_t>(exe, h + 0x18);
      size = Read<uint64_t>(exe, h + 0x20);
    };
    uint32_t sn;
    uint64_t stroff, strsize;
    section(shstrndx, sn, stroff, strsize);
    for (int i = 0; i < shnum; ++i) {
      uint32_t name;
      uint64_t off, size;
      section(i, name, off, size);
      const size_t n = at + stroff + name;
      if (name >= strsize || n >= exe.size()) continue;
      const std::string sname(
          reinterpret_cast<const char*>(exe.data() + n),
          strnlen(reinterpret_cast<const char*>(exe.data() + n), exe.size() - n));
      if (sname.rfind(".text.", 0) != 0 || at + off + size > exe.size()) continue;
      for (uint64_t k = 0; k + 16 <= size; k += 16) {
        const uint64_t lo = Read<uint64_t>(exe, at + off + k);
        if ((lo & 0x1ff) == 0x1ae)
          out.push_back({sname.substr(6), static_cast<uint32_t>(lo & 0xfff)});
      }
    }
  }
  return out;
}

TEST(CudaFlashAttentionSass, EveryAsyncCopyTakesTheUsualForm) {
  // (Links the attention kernels into this executable.)
  ASSERT_TRUE(kernels::WideAttentionSupported(128));
  std::ifstream f("/proc/self/exe", std::ios::binary);
  ASSERT_TRUE(f.good());
  const std::vector<uint8_t> exe((std::istreambuf_iterator<char>(f)),
                                 std::istreambuf_iterator<char>());
  int cubins = 0;
  const std::vector<AsyncCopy> copies = AsyncCopies(exe, &cubins);
  if (cubins == 0) GTEST_SKIP() << "no uncompressed sm_90 cubin in this executable";
  int attention = 0;
  for (const AsyncCopy& c : copies) {
    if (c.kernel.find("MmaAttentionKernel") != std::string::npos) ++attention;
    EXPECT_EQ(c.opcode, 0xfaeu) << c.kernel;
  }
  // The mma.sync attention kernels were found and read: eight instantiations
  // with several cp.async each.
  EXPECT_GE(attention, 8 * 8);
}

}  // namespace
}  // namespace agentkv::backend::cuda

#else

TEST(CudaFlashAttentionSass, Skipped) { GTEST_SKIP() << "built without CUDA (no toolkit found)"; }

#endif
