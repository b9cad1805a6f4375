// Tiled (flash-style) attention on the CPU: a group of query rows that share
// one KV head (GQA: a run of tokens times the heads of the group) against
// the keys 16 positions at a time, with an online softmax, so no score
// matrix is materialised and every key tile is loaded once for all rows.
// AttendOne (cpu_kernels.h) is its reference.
//
// Why: one (token, head) at a time re-reads every key per query and reduces
// each dot product horizontally; a 4k-token prefill spent most of its time
// there. Here a key tile is transposed once to [head_dim][16], each row's 16
// scores are two FMA accumulators, and exp runs 8 lanes at a time.
//
// Thread-safety: pure functions over caller buffers.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace agentkv::backend::cpu::kernels {

inline constexpr int kKeyTile = 16;

// e^x for 8 lanes; relative error below 2e-7 for x in [-87, 88] (Cody-Waite
// reduction to |r| <= ln2/2 and a degree-6 Taylor polynomial), 0 below.
inline __m256 Exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

inline float HorizontalSum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline float HorizontalMax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// Per-row state of AttendRows; the caller provides `rows` of them.
struct AttnRow {
  const float* q = nullptr;  // head_dim floats
  float* out = nullptr;      // head_dim floats, written at the end
  int32_t pos = 0;           // the query's position: keys <= pos are visible
  int32_t lo = 0;            // first visible key position (sliding window)
  // Attention sink logit of the row's head (GPT-OSS): joins the softmax
  // denominator unscaled, with no value; -inf for none.
  float sink = -INFINITY;
};

// Scratch floats AttendRows needs for `rows` rows.
inline int64_t AttendRowsScratch(int rows, int head_dim) {
  return static_cast<int64_t>(rows) * (head_dim + 2 + kKeyTile) + 2 * head_dim * kKeyTile;
}

// out_r = softmax_j(scale * q_r . k_j, soft-capped, over lo_r <= j <= pos_r)
// . v_j for every row, the row's sink (if any) counted in the softmax's
// denominator. key(p) / value(p) return head_dim floats for key
// position p, for p in [min lo, max pos]. head_dim must be a multiple of 8.
template <typename KeyFn, typename ValFn>
void AttendRows(AttnRow* rows, int nrows, int head_dim, float scale, float softcap, KeyFn key,
                ValFn value, float* scratch) {
  const int D = head_dim;
  float* acc = scratch;                                    // [nrows][D]
  float* m = acc + static_cast<int64_t>(nrows) * D;        // [nrows]
  float* l = m + nrows;                                    // [nrows]
  float* p = l + nrows;                                    // [nrows][kKeyTile]
  float* kt = p + static_cast<int64_t>(nrows) * kKeyTile;  // [D][kKeyTile]
  int32_t first = rows[0].lo, last = rows[0].pos;
  for (int r = 0; r < nrows; ++r) {
    first = std::min(first, rows[r].lo);
    last = std::max(last, rows[r].pos);
    m[r] = -3.0e38f;
    l[r] = 0.f;
    for (int d = 0; d < D; ++d) acc[static_cast<int64_t>(r) * D + d] = 0.f;
  }
  const float* vrow[kKeyTile];
  for (int32_t t0 = first; t0 <= last; t0 += kKeyTile) {
    const int nk = std::min<int32_t>(kKeyTile, last - t0 + 1);
    // K tile transposed to [D][16]; missing keys are zeros (masked below).
    for (int j = 0; j < kKeyTile; ++j) {
      if (j < nk) {
        const float* k = key(t0 + j);
        for (int d = 0; d < D; ++d) kt[d * kKeyTile + j] = k[d];
        vrow[j] = value(t0 + j);
      } else {
        for (int d = 0; d < D; ++d) kt[d * kKeyTile + j] = 0.f;
        vrow[j] = nullptr;
      }
    }
    for (int r = 0; r < nrows; ++r) {
      const AttnRow& row = rows[r];
      if (t0 > row.pos || t0 + nk - 1 < row.lo) continue;  // nothing visible
      // Four independent accumulators (even and odd d) hide the FMA latency.
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
      __m256 u0 = _mm256_setzero_ps(), u1 = _mm256_setzero_ps();
      for (int d = 0; d < D; d += 2) {
        const __m256 qd = _mm256_broadcast_ss(row.q + d);
        const __m256 qe = _mm256_broadcast_ss(row.q + d + 1);
        const float* k0 = kt + d * kKeyTile;
        s0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0), s0);
        s1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + 8), s1);
        u0 = _mm256_fmadd_ps(qe, _mm256_loadu_ps(k0 + kKeyTile), u0);
        u1 = _mm256_fmadd_ps(qe, _mm256_loadu_ps(k0 + kKeyTile + 8), u1);
      }
      s0 = _mm256_add_ps(s0, u0);
      s1 = _mm256_add_ps(s1, u1);
      float* pr = p + static_cast<int64_t>(r) * kKeyTile;
      const __m256 sc = _mm256_set1_ps(scale);
      s0 = _mm256_mul_ps(s0, sc);
      s1 = _mm256_mul_ps(s1, sc);
      float tile_max;
      if (softcap == 0.f && nk == kKeyTile && t0 >= row.lo && t0 + kKeyTile - 1 <= row.pos) {
        tile_max = HorizontalMax(_mm256_max_ps(s0, s1));  // every key visible
      } else {
        _mm256_storeu_ps(pr, s0);
        _mm256_storeu_ps(pr + 8, s1);
        tile_max = -3.0e38f;
        for (int j = 0; j < kKeyTile; ++j) {
          const int32_t kp = t0 + j;
          if (j >= nk || kp > row.pos || kp < row.lo) {
            pr[j] = -INFINITY;
            continue;
          }
          if (softcap > 0.f) pr[j] = softcap * std::tanh(pr[j] / softcap);
          tile_max = std::max(tile_max, pr[j]);
        }
        s0 = _mm256_loadu_ps(pr);
        s1 = _mm256_loadu_ps(pr + 8);
      }
      const float m_new = std::max(m[r], tile_max);
      const float corr = m[r] == m_new ? 1.f : std::exp(m[r] - m_new);
      const __m256 mv = _mm256_set1_ps(m_new);
      const __m256 e0 = Exp8(_mm256_sub_ps(s0, mv));
      const __m256 e1 = Exp8(_mm256_sub_ps(s1, mv));
      _mm256_storeu_ps(pr, e0);
      _mm256_storeu_ps(pr + 8, e1);
      l[r] = l[r] * corr + HorizontalSum(_mm256_add_ps(e0, e1));
      m[r] = m_new;
      // acc = acc * corr + P V, 32 columns of acc in four registers at a
      // time: independent FMA chains, 16 FMAs per load and store.
      float* a = acc + static_cast<int64_t>(r) * D;
      const __m256 cv = _mm256_set1_ps(corr);
      int d = 0;
      for (; d + 32 <= D; d += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(a + d), cv);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(a + d + 8), cv);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(a + d + 16), cv);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(a + d + 24), cv);
        for (int j = 0; j < nk; ++j) {
          const __m256 pj = _mm256_broadcast_ss(pr + j);
          const float* v = vrow[j] + d;
          a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v), a0);
          a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8), a1);
          a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 16), a2);
          a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 24), a3);
        }
        _mm256_storeu_ps(a + d, a0);
        _mm256_storeu_ps(a + d + 8, a1);
        _mm256_storeu_ps(a + d + 16, a2);
        _mm256_storeu_ps(a + d + 24, a3);
      }
      for (; d < D; d += 8) {
        __m256 av = _mm256_mul_ps(_mm256_loadu_ps(a + d), cv);
        for (int j = 0; j < nk; ++j)
          av = _mm256_fmadd_ps(_mm256_broadcast_ss(pr + j), _mm256_loadu_ps(vrow[j] + d), av);
        _mm256_storeu_ps(a + d, av);
      }
    }
  }
  for (int r = 0; r < nrows; ++r) {
    float corr = 1.f;
    if (rows[r].sink > -INFINITY) {
      // The sink as one more score: rescale to the larger maximum.
      const float m_new = std::max(m[r], rows[r].sink);
      corr = std::exp(m[r] - m_new);
      l[r] = l[r] * corr + std::exp(rows[r].sink - m_new);
    }
    const float inv = l[r] > 0.f ? corr / l[r] : 0.f;
    const float* a = acc + static_cast<int64_t>(r) * D;
    for (int d = 0; d < D; ++d) rows[r].out[d] = a[d] * inv;
  }
}

}  // namespace agentkv::backend::cpu::kernels
