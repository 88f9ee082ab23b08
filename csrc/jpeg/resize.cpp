// The decode-and-crop op's two resize passes over RGBX rows (see decode_jpeg_crop.cpp for the
// filter and the fixed-point format), each in two kernels with the same integer arithmetic:
//
// * portable: the vertical pass in plain C++ the compiler vectorises (FASTPIPE_CLONES builds it
//   for AVX2 too), one pass over an int32 row per tap; the horizontal pass with SSE2 (x86-64's
//   baseline; plain C++ elsewhere), one output pixel per 128-bit register, through an RGBX row
//   that a second loop splits into the planes.
// * avx2 (x86-64 with GCC or Clang, used when the CPU has it): the vertical pass keeps the sums
//   of all taps in registers (two rows per _mm256_madd_epi16, 16 bytes of each at a time) and
//   writes each int16 once, instead of reading and writing an int32 row per tap; the horizontal
//   pass computes two output pixels per 256-bit register (their weights laid out once per image,
//   pack_wide_pairs, and each pixel pair's channels regrouped by one byte shuffle) and transposes
//   16 RGBX pixels straight into the three planes (byte shuffles), with no RGBX row in between.
//
// Why bit-identical: every product is an int16 weight (<= 1 << 14) times a non-negative value
// below 2**15, summed in int32 without overflow, with the same rounding constant and shift, so
// grouping the sums differently cannot change them. tests/test_jpeg_resize.py checks it on photos.
//
// The choice is made per image at run time (__builtin_cpu_supports), not by the compiler's
// flags, so one build runs on every x86-64; set_kernel forces one, so a benchmark can time both
// in one run (fastpipe::_jpeg_set_resize_kernel, below).
#include "resize.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__INTEL_COMPILER)
#define FASTPIPE_RESIZE_AVX2 1
#include <immintrin.h>
#define FASTPIPE_AVX2_FN __attribute__((target("avx2")))
#endif

#include "../clones.h"  // FASTPIPE_CLONES: AVX2 and baseline, picked at load time

namespace fastpipe {
namespace resize {
namespace {

#define FASTPIPE_INLINE inline __attribute__((always_inline))

enum Choice : int { kAuto = 0, kPortable = 1, kAvx2 = 2, kSkip = 3 };
std::atomic<int> g_choice{kAuto};

bool cpu_has_avx2() {
#if defined(FASTPIPE_RESIZE_AVX2)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

const char* choice_name(int c) {
  switch (c) {
    case kPortable: return "portable";
    case kAvx2: return "avx2";
    case kSkip: return "skip";
    default: return "auto";
  }
}

// ---------------------------------------------------------------------------------------------
// Portable kernels.

constexpr int kVerticalShift = kVerticalBits - kFractionBits;

FASTPIPE_CLONES
void vertical_row_portable(const uint8_t* const* rows, const int32_t* w, int taps, int n, int32_t* acc, int16_t* out) {
  {
    const uint8_t* r = rows[0];
    const int32_t w0 = w[0];
    for (int i = 0; i < n; ++i) acc[i] = w0 * static_cast<int32_t>(r[i]);
  }
  for (int k = 1; k < taps; ++k) {
    const uint8_t* r = rows[k];
    const int32_t wk = w[k];
    for (int i = 0; i < n; ++i) acc[i] += wk * static_cast<int32_t>(r[i]);
  }
  constexpr int32_t half = 1 << (kVerticalShift - 1);
  for (int i = 0; i < n; ++i) out[i] = static_cast<int16_t>((acc[i] + half) >> kVerticalShift);
}

#if defined(__SSE2__)
// RGBX rows with SSE2: two taps at a time, each channel's pair of samples interleaved with the
// pair of weights, so one _mm_madd_epi16 does 8 multiply-adds.
template <int NP>
FASTPIPE_INLINE __m128i rgbx_pixel(const int16_t* row, int first, const int32_t* w, int n_pairs, __m128i half) {
  const int16_t* src = row + static_cast<size_t>(first) * 4;
  __m128i acc = half;
  for (int j = 0; j < (NP > 0 ? NP : n_pairs); ++j) {
    const __m128i two = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j * 8));  // pixels 2j, 2j+1
    const __m128i interleaved = _mm_unpacklo_epi16(two, _mm_srli_si128(two, 8));      // per channel: (2j, 2j+1)
    acc = _mm_add_epi32(acc, _mm_madd_epi16(interleaved, _mm_set1_epi32(w[j])));
  }
  return _mm_srai_epi32(acc, kFinalShift);
}

// Four output pixels per step (independent chains), packed with saturation to 16 RGBX bytes in
// `rgbx`, then split into the three planes.
template <int NP>
FASTPIPE_INLINE void horizontal_rgbx_sse2(const int16_t* row, const int* first, const int32_t* pairs, int np, int out_w, uint8_t* rgbx,
                                          uint8_t* const* planes) {
  const __m128i half = _mm_set1_epi32(1 << (kFinalShift - 1));
  const int n_pairs = NP > 0 ? NP : np;
  int xo = 0;
  for (; xo + 4 <= out_w; xo += 4) {
    const int32_t* w = pairs + static_cast<size_t>(xo) * n_pairs;
    const __m128i a = rgbx_pixel<NP>(row, first[xo], w, n_pairs, half);
    const __m128i b = rgbx_pixel<NP>(row, first[xo + 1], w + n_pairs, n_pairs, half);
    const __m128i c = rgbx_pixel<NP>(row, first[xo + 2], w + 2 * n_pairs, n_pairs, half);
    const __m128i d = rgbx_pixel<NP>(row, first[xo + 3], w + 3 * n_pairs, n_pairs, half);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(rgbx + static_cast<size_t>(xo) * 4), packed);
  }
  for (; xo < out_w; ++xo) {
    const __m128i a = rgbx_pixel<NP>(row, first[xo], pairs + static_cast<size_t>(xo) * n_pairs, n_pairs, half);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(a, a), a);
    const uint32_t px = static_cast<uint32_t>(_mm_cvtsi128_si32(packed));
    std::memcpy(rgbx + static_cast<size_t>(xo) * 4, &px, 4);
  }
  uint8_t* const p0 = planes[0];
  uint8_t* const p1 = planes[1];
  uint8_t* const p2 = planes[2];
  const __m128i low = _mm_set1_epi32(0xFF);
  int x = 0;
  for (; x + 16 <= out_w; x += 16) {  // 16 RGBX pixels into 16 bytes of each plane
    __m128i v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rgbx + static_cast<size_t>(x + 4 * i) * 4));
    uint8_t* const dst[3] = {p0 + x, p1 + x, p2 + x};
    for (int c = 0; c < 3; ++c) {
      __m128i ch[4];
      for (int i = 0; i < 4; ++i) ch[i] = _mm_and_si128(_mm_srli_epi32(v[i], 8 * c), low);
      const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(ch[0], ch[1]), _mm_packs_epi32(ch[2], ch[3]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst[c]), bytes);
    }
  }
  for (; x < out_w; ++x) {
    p0[x] = rgbx[4 * x];
    p1[x] = rgbx[4 * x + 1];
    p2[x] = rgbx[4 * x + 2];
  }
}

void horizontal_row4_portable(const int16_t* row, const int* first, const int32_t* pairs, int np, int out_w, uint8_t* rgbx,
                              uint8_t* const* planes) {
  switch (np) {  // ksize = 2 * ceil(shrink factor) + 1 taps: 2 pairs when enlarging, 3 up to 2x shrink
    case 2: return horizontal_rgbx_sse2<2>(row, first, pairs, np, out_w, rgbx, planes);
    case 3: return horizontal_rgbx_sse2<3>(row, first, pairs, np, out_w, rgbx, planes);
    case 4: return horizontal_rgbx_sse2<4>(row, first, pairs, np, out_w, rgbx, planes);
    default: return horizontal_rgbx_sse2<0>(row, first, pairs, np, out_w, rgbx, planes);
  }
}
#else
// Plain C++ (no SSE2): the same sums, one output pixel at a time.
FASTPIPE_CLONES
void horizontal_row4_portable(const int16_t* row, const int* first, const int32_t* pairs, int np, int out_w, uint8_t* /*rgbx*/,
                              uint8_t* const* planes) {
  constexpr int32_t half = 1 << (kFinalShift - 1);
  for (int xo = 0; xo < out_w; ++xo) {
    const int16_t* src = row + static_cast<size_t>(first[xo]) * 4;
    const int32_t* w = pairs + static_cast<size_t>(xo) * np;
    int32_t acc[4] = {half, half, half, half};
    for (int j = 0; j < np; ++j) {
      const int32_t lo = static_cast<int16_t>(w[j] & 0xFFFF), hi = static_cast<int16_t>(static_cast<uint32_t>(w[j]) >> 16);
      for (int c = 0; c < 4; ++c) acc[c] += lo * src[8 * j + c] + hi * src[8 * j + 4 + c];
    }
    for (int c = 0; c < 3; ++c) {
      const int32_t v = acc[c] >> kFinalShift;
      planes[c][xo] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// AVX2 kernels.

#if defined(FASTPIPE_RESIZE_AVX2)
// 16 bytes of two rows: each widened to 16 int16, interleaved (a0, b0, a1, b1, ... within each
// 128-bit lane), and weighted by (wa, wb) in one _mm256_madd_epi16 per 8 sums.
FASTPIPE_AVX2_FN FASTPIPE_INLINE void two_taps(const uint8_t* a, const uint8_t* b, int i, __m256i w, __m256i& lo, __m256i& hi) {
  const __m256i va = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
  const __m256i vb = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
  lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(va, vb), w));  // elements 0-3 and 8-11
  hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(va, vb), w));  // elements 4-7 and 12-15
}

FASTPIPE_AVX2_FN
void vertical_row_avx2(const uint8_t* const* rows, const int32_t* w, int taps, int n, int16_t* out) {
  constexpr int kMaxPairs = 16;  // 32 taps: a 15x shrink at the op's DCT scale (the scale caps it near 2x)
  const int n_pairs = (taps + 1) / 2;
  if (n_pairs > kMaxPairs) {
    std::vector<int32_t> acc(static_cast<size_t>(n));
    return vertical_row_portable(rows, w, taps, n, acc.data(), out);
  }
  __m256i wp[kMaxPairs];
  const uint8_t* ra[kMaxPairs];
  const uint8_t* rb[kMaxPairs];
  for (int j = 0; j < n_pairs; ++j) {
    const bool odd_tail = 2 * j + 1 >= taps;  // the last tap paired with weight 0 on the same row
    ra[j] = rows[2 * j];
    rb[j] = odd_tail ? rows[2 * j] : rows[2 * j + 1];
    const uint32_t lo = static_cast<uint16_t>(w[2 * j]), hi = odd_tail ? 0u : static_cast<uint16_t>(w[2 * j + 1]);
    wp[j] = _mm256_set1_epi32(static_cast<int32_t>(lo | (hi << 16)));
  }
  const __m256i half = _mm256_set1_epi32(1 << (kVerticalShift - 1));
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i lo = half, hi = half;
    for (int j = 0; j < n_pairs; ++j) two_taps(ra[j], rb[j], i, wp[j], lo, hi);
    lo = _mm256_srai_epi32(lo, kVerticalShift);
    hi = _mm256_srai_epi32(hi, kVerticalShift);
    // packs works per 128-bit lane, as the unpacks did: the int16 come back in order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_packs_epi32(lo, hi));
  }
  for (; i < n; ++i) {
    int32_t acc = 1 << (kVerticalShift - 1);
    for (int k = 0; k < taps; ++k) acc += w[k] * static_cast<int32_t>(rows[k][i]);
    out[i] = static_cast<int16_t>(acc >> kVerticalShift);
  }
}

// Two pixels' RGBX int16 (2j, 2j+1 of each output's taps) regrouped per channel, (2j, 2j+1) pairs:
// one byte shuffle per 128-bit lane, the same int16 as unpacklo(two, two >> 8) in rgbx_pixel.
FASTPIPE_AVX2_FN FASTPIPE_INLINE __m256i by_pairs(__m256i two) {
  return _mm256_shuffle_epi8(two, _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, 0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6,
                                                   7, 14, 15));
}

FASTPIPE_AVX2_FN FASTPIPE_INLINE __m256i two_sources(const int16_t* s0, const int16_t* s1, int j) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s0 + j * 8))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(s1 + j * 8)), 1);
}

// Output pixels x0 (low lane) and x1 (high lane): per lane exactly rgbx_pixel's arithmetic. `wide`
// holds each pair j's weights already laid out for both lanes (pack_wide_pairs: four copies of
// x0's pair, then four of x1's), so the loop is two loads, a shuffle, a madd and an add per pair.
template <int NP>
FASTPIPE_AVX2_FN FASTPIPE_INLINE __m256i rgbx_two(const int16_t* row, int f0, int f1, const int32_t* wide, int n_pairs, __m256i half) {
  const int16_t* s0 = row + static_cast<size_t>(f0) * 4;
  const int16_t* s1 = row + static_cast<size_t>(f1) * 4;
  __m256i acc = half;
  for (int j = 0; j < (NP > 0 ? NP : n_pairs); ++j) {
    const __m256i wj = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wide + 8 * j));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(by_pairs(two_sources(s0, s1, j)), wj));
  }
  return _mm256_srai_epi32(acc, kFinalShift);
}

// One output pixel in both lanes (the high one unused), its weights broadcast: the row's last
// out_w % 8 pixels.
template <int NP>
FASTPIPE_AVX2_FN FASTPIPE_INLINE __m256i rgbx_one(const int16_t* row, int f, const int32_t* w, int n_pairs, __m256i half) {
  const int16_t* s = row + static_cast<size_t>(f) * 4;
  __m256i acc = half;
  for (int j = 0; j < (NP > 0 ? NP : n_pairs); ++j) {
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(by_pairs(two_sources(s, s, j)), _mm256_set1_epi32(w[j])));
  }
  return _mm256_srai_epi32(acc, kFinalShift);
}

// Eight output pixels from x (even), as bytes: lane 0 holds pixels x, x+2, x+4, x+6 (RGBX each), lane 1
// pixels x+1, x+3, x+5, x+7; then each lane's bytes grouped by channel (R R R R G G G G ...), and
// the two lanes' groups interleaved: (R of x..x+7, G of x..x+7) and (B of x..x+7, X ...).
template <int NP>
FASTPIPE_AVX2_FN FASTPIPE_INLINE void eight_pixels(const int16_t* row, const int* first, const int32_t* wide, int n_pairs, int x, __m256i half,
                                                  __m128i& rg, __m128i& bx) {
  const int32_t* w = wide + static_cast<size_t>(x / 2) * n_pairs * 8;  // output pair x / 2
  const int step = n_pairs * 8;
  const __m256i a = rgbx_two<NP>(row, first[x], first[x + 1], w, n_pairs, half);
  const __m256i b = rgbx_two<NP>(row, first[x + 2], first[x + 3], w + step, n_pairs, half);
  const __m256i c = rgbx_two<NP>(row, first[x + 4], first[x + 5], w + 2 * step, n_pairs, half);
  const __m256i d = rgbx_two<NP>(row, first[x + 6], first[x + 7], w + 3 * step, n_pairs, half);
  const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  const __m256i by_channel =
      _mm256_shuffle_epi8(bytes, _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m128i even = _mm256_castsi256_si128(by_channel), odd = _mm256_extracti128_si256(by_channel, 1);
  rg = _mm_unpacklo_epi8(even, odd);
  bx = _mm_unpackhi_epi8(even, odd);
}

template <int NP>
FASTPIPE_AVX2_FN void horizontal_avx2(const int16_t* row, const int* first, const int32_t* pairs, const int32_t* wide, int np, int out_w,
                                      uint8_t* const* planes) {
  const __m256i half = _mm256_set1_epi32(1 << (kFinalShift - 1));
  const int n_pairs = NP > 0 ? NP : np;
  uint8_t* const p0 = planes[0];
  uint8_t* const p1 = planes[1];
  uint8_t* const p2 = planes[2];
  int x = 0;
  for (; x + 16 <= out_w; x += 16) {
    __m128i rg0, bx0, rg1, bx1;
    eight_pixels<NP>(row, first, wide, n_pairs, x, half, rg0, bx0);
    eight_pixels<NP>(row, first, wide, n_pairs, x + 8, half, rg1, bx1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + x), _mm_unpacklo_epi64(rg0, rg1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + x), _mm_unpackhi_epi64(rg0, rg1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p2 + x), _mm_unpacklo_epi64(bx0, bx1));
  }
  for (; x + 8 <= out_w; x += 8) {
    __m128i rg, bx;
    eight_pixels<NP>(row, first, wide, n_pairs, x, half, rg, bx);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p0 + x), rg);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p1 + x), _mm_unpackhi_epi64(rg, rg));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p2 + x), bx);
  }
  for (; x < out_w; ++x) {  // the last out_w % 8 pixels, one at a time
    const __m256i a = rgbx_one<NP>(row, first[x], pairs + static_cast<size_t>(x) * n_pairs, n_pairs, half);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_castsi256_si128(a)), _mm_setzero_si128());
    const uint32_t px = static_cast<uint32_t>(_mm_cvtsi128_si32(packed));
    p0[x] = static_cast<uint8_t>(px);
    p1[x] = static_cast<uint8_t>(px >> 8);
    p2[x] = static_cast<uint8_t>(px >> 16);
  }
}

void horizontal_row4_avx2(const int16_t* row, const int* first, const int32_t* pairs, const int32_t* wide, int np, int out_w,
                          uint8_t* const* planes) {
  switch (np) {
    case 2: return horizontal_avx2<2>(row, first, pairs, wide, np, out_w, planes);
    case 3: return horizontal_avx2<3>(row, first, pairs, wide, np, out_w, planes);
    case 4: return horizontal_avx2<4>(row, first, pairs, wide, np, out_w, planes);
    default: return horizontal_avx2<0>(row, first, pairs, wide, np, out_w, planes);
  }
}
#endif  // FASTPIPE_RESIZE_AVX2

}  // namespace

Kernel current_kernel() {
  const int c = g_choice.load(std::memory_order_relaxed);
  if (c == kSkip) return Kernel::kSkip;
  return c != kPortable && cpu_has_avx2() ? Kernel::kAvx2 : Kernel::kPortable;
}

std::string set_kernel(const std::string& choice) {
  int c;
  if (choice == "auto") {
    c = kAuto;
  } else if (choice == "portable") {
    c = kPortable;
  } else if (choice == "avx2") {
    TORCH_CHECK(cpu_has_avx2(), "_jpeg_set_resize_kernel: this build or CPU has no AVX2 kernel (available: portable)");
    c = kAvx2;
  } else if (choice == "skip") {
    c = kSkip;
  } else {
    TORCH_CHECK(false, "_jpeg_set_resize_kernel: the kernel must be 'auto', 'portable', 'avx2' or 'skip', got '", choice, "'");
  }
  return choice_name(g_choice.exchange(c));
}

std::vector<std::string> available_kernels() {
  if (cpu_has_avx2()) return {"avx2", "portable"};
  return {"portable"};
}

void vertical_row(Kernel kernel, const uint8_t* const* rows, const int32_t* w, int taps, int n, int32_t* acc, int16_t* out) {
#if defined(FASTPIPE_RESIZE_AVX2)
  if (kernel == Kernel::kAvx2) return vertical_row_avx2(rows, w, taps, n, out);
#endif
  (void)kernel;
  vertical_row_portable(rows, w, taps, n, acc, out);
}

size_t wide_pairs_size(int n_pairs, int out_w) { return static_cast<size_t>(out_w / 2) * n_pairs * 8; }

void pack_wide_pairs(const int32_t* pairs, int n_pairs, int out_w, int32_t* wide) {
  for (int p = 0; p < out_w / 2; ++p) {
    for (int j = 0; j < n_pairs; ++j) {
      int32_t* v = wide + (static_cast<size_t>(p) * n_pairs + j) * 8;
      const int32_t w0 = pairs[static_cast<size_t>(2 * p) * n_pairs + j], w1 = pairs[static_cast<size_t>(2 * p + 1) * n_pairs + j];
      for (int l = 0; l < 4; ++l) {
        v[l] = w0;
        v[4 + l] = w1;
      }
    }
  }
}

void horizontal_row4(Kernel kernel, const int16_t* row, const int* first, const int32_t* pairs, const int32_t* wide, int n_pairs, int out_w,
                     uint8_t* rgbx, uint8_t* const* planes) {
#if defined(FASTPIPE_RESIZE_AVX2)
  if (kernel == Kernel::kAvx2) return horizontal_row4_avx2(row, first, pairs, wide, n_pairs, out_w, planes);
#endif
  (void)kernel;
  (void)wide;
  horizontal_row4_portable(row, first, pairs, n_pairs, out_w, rgbx, planes);
}

namespace {

// Measurement and test aids, not part of any pipeline: benchmarks/bench_jpeg.py times the op
// with each kernel in one run, tests/test_jpeg_resize.py compares their bytes.
std::string set_resize_kernel_op(std::string choice) { return set_kernel(choice); }
std::vector<std::string> resize_kernels_op() { return available_kernels(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastpipe, m) {
  // The process-wide choice of the resize kernels ("auto", "portable", "avx2", or "skip": no resize,
  // output unwritten, for timing the decode alone); returns the previous one.
  m.def("_jpeg_set_resize_kernel(str kernel) -> str", &set_resize_kernel_op);
  // The kernels this build and CPU can run, best first.
  m.def("_jpeg_resize_kernels() -> str[]", &resize_kernels_op);
}

}  // namespace resize
}  // namespace fastpipe
