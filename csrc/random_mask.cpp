// RandomMask kernels: an independent Bernoulli(ratio) draw per pixel, a 4-neighbour
// dilation, then those pixels set to zero in every channel (the article's RandomMask).
//
// The draw comes from counter-based SplitMix64, word i = mix64(seed + (i + 1) * gamma), the
// same stream fastpipe/transforms/_prng.py computes with NumPy and the Numba kernels compute
// in their loops, so all backends agree bit for bit. Pixel p = y * W + x uses the `bits`-bit
// chunk p % (64 / bits) of word p / (64 / bits), and is drawn when that chunk < threshold.
//
// The fused kernel keeps three rows of draws (W + 2 bytes each, zero padded like scipy's
// convolve2d(mode="same")) rather than a full-size mask.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include "clones.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace fastpipe {
namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kMix2 = 0x94D049BB133111EBULL;

inline uint64_t splitmix_word(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * kGamma;
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  return z ^ (z >> 31);
}

struct Quantized {
  int bits;
  uint64_t threshold;
  // For bits <= 8: lut[v] holds the 8 / bits draws that byte value v of a word encodes, so a
  // whole word is turned into draws a byte at a time instead of a chunk at a time.
  uint8_t lut[256][8];
};

// Mirrors fastpipe.transforms._prng.quantize_ratio exactly (the same double arithmetic).
Quantized quantize_ratio(double ratio) {
  TORCH_CHECK(ratio >= 0.0 && ratio <= 1.0, "fastpipe::RandomMask: ratio must be in [0, 1], got ", ratio);
  Quantized q{16, 0, {}};
  q.threshold = static_cast<uint64_t>(std::floor(ratio * 65536.0 + 0.5));
  for (int bits : {1, 2, 4, 8, 16}) {
    const double scaled = ratio * static_cast<double>(1 << bits);
    if (scaled == std::floor(scaled)) {
      q.bits = bits;
      q.threshold = static_cast<uint64_t>(scaled);
      break;
    }
  }
  if (q.bits <= 8) {
    const int per_byte = 8 / q.bits;
    const unsigned chunk_mask = (1u << q.bits) - 1;
    for (unsigned v = 0; v < 256; ++v)
      for (int k = 0; k < per_byte; ++k) q.lut[v][k] = ((v >> (q.bits * k)) & chunk_mask) < q.threshold;
  }
  return q;
}

uint64_t check_seed(int64_t seed) {
  TORCH_CHECK(seed >= 0, "fastpipe::RandomMask: seed must be in [0, 2**63), got ", seed);
  return static_cast<uint64_t>(seed);
}

template <int kPerByte>
inline void draw_word(uint8_t* out, uint64_t word, const Quantized& q) {
  for (int j = 0; j < 8; ++j) std::memcpy(out + j * kPerByte, q.lut[(word >> (8 * j)) & 0xFF], kPerByte);
}

// row[x] = 1 where pixel (y, x) is drawn, else 0, for x in [0, width).
void draw_row(uint8_t* row, int64_t y, int64_t width, uint64_t seed, const Quantized& q) {
  const int64_t per_word = 64 / q.bits;
  const uint64_t chunk_mask = (uint64_t{1} << q.bits) - 1;
  int64_t p = y * width;
  const int64_t end = p + width;
  while (p < end) {
    const int64_t index = p / per_word;
    const int64_t first = p - index * per_word;
    const int64_t count = std::min(end - p, per_word - first);
    const uint64_t word = splitmix_word(seed, static_cast<uint64_t>(index));
    if (count == per_word && q.bits <= 8) {  // a whole word: a byte at a time
      switch (q.bits) {
        case 1: draw_word<8>(row, word, q); break;
        case 2: draw_word<4>(row, word, q); break;
        case 4: draw_word<2>(row, word, q); break;
        default: draw_word<1>(row, word, q); break;
      }
    } else if (count == per_word) {  // a whole word of four 16-bit chunks
      for (int k = 0; k < 4; ++k) row[k] = ((word >> (16 * k)) & 0xFFFF) < q.threshold;
    } else {
      const uint64_t shifted = word >> (q.bits * first);
      for (int64_t k = 0; k < count; ++k) row[k] = ((shifted >> (q.bits * k)) & chunk_mask) < q.threshold;
    }
    row += count;
    p += count;
  }
}

// hit[x] = 4-neighbour dilation of row y, from draws of rows y-1, y, y+1 at offsets 1..W.
inline void dilate_row(const uint8_t* __restrict__ prev, const uint8_t* __restrict__ cur, const uint8_t* __restrict__ next,
                       uint8_t* __restrict__ hit, int64_t width) {
  for (int64_t x = 0; x < width; ++x) hit[x] = cur[x] | cur[x + 1] | cur[x + 2] | prev[x + 1] | next[x + 1];
}

// A (C, H, W) image of any strides.
template <typename scalar_t>
struct View {
  scalar_t* data;
  int64_t channels, height, width, sc, sh, sw;

  explicit View(const at::Tensor& img)
      : data(img.data_ptr<scalar_t>()),
        channels(img.dim() == 3 ? img.size(0) : 1),
        height(img.size(-2)),
        width(img.size(-1)),
        sc(img.dim() == 3 ? img.stride(0) : 0),
        sh(img.stride(-2)),
        sw(img.stride(-1)) {}

  bool planar() const { return sw == 1; }
  bool interleaved() const { return channels > 1 && sc == 1 && sw == channels; }
  bool rgb_interleaved() const { return channels == 3 && interleaved(); }
};

// The uint8 HWC -> CHW copy-and-mask, the toy pipeline's hot loop. De-interleaving bytes needs
// byte shuffles (SSSE3 and up), which the x86-64 baseline the extension is built for lacks; on
// Linux with GCC or Clang an AVX2 clone is compiled next to the baseline one and picked at load time (clones.h).

FASTPIPE_CLONES void rgb_u8_to_planar(const uint8_t* __restrict__ src, uint8_t* __restrict__ r, uint8_t* __restrict__ g,
                                      uint8_t* __restrict__ b, const uint8_t* __restrict__ hit, int64_t width) {
  for (int64_t x = 0; x < width; ++x) {
    const uint8_t keep = static_cast<uint8_t>(hit[x] == 0);
    r[x] = static_cast<uint8_t>(src[3 * x] * keep);
    g[x] = static_cast<uint8_t>(src[3 * x + 1] * keep);
    b[x] = static_cast<uint8_t>(src[3 * x + 2] * keep);
  }
}

// Loops that compilers vectorise. restrict: the flags never alias the images, and src and dst are
// distinct in the *_copy versions (in place uses the single-pointer versions). Integers multiply by
// 0 or 1 (exact); floats select, since a multiply would keep NaN and inf.
template <typename scalar_t>
struct Runs {
  static constexpr bool kMultiply = std::is_integral<scalar_t>::value;

  static scalar_t masked(scalar_t value, uint8_t hit) {
    if constexpr (kMultiply) {
      return static_cast<scalar_t>(value * static_cast<scalar_t>(hit == 0));
    } else {
      return hit ? static_cast<scalar_t>(0) : value;
    }
  }

  static void in_place(scalar_t* __restrict__ run, const uint8_t* __restrict__ hit, int64_t n) {
    for (int64_t i = 0; i < n; ++i) run[i] = masked(run[i], hit[i]);
  }

  static void copy(const scalar_t* __restrict__ src, scalar_t* __restrict__ dst, const uint8_t* __restrict__ hit, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = masked(src[i], hit[i]);
  }

  static void rgb_in_place(scalar_t* __restrict__ row, const uint8_t* __restrict__ hit, int64_t width) {
    for (int64_t x = 0; x < width; ++x) {
      row[3 * x] = masked(row[3 * x], hit[x]);
      row[3 * x + 1] = masked(row[3 * x + 1], hit[x]);
      row[3 * x + 2] = masked(row[3 * x + 2], hit[x]);
    }
  }

  // RGB interleaved source (HWC memory) into three planar runs: the HWC -> CHW copy and the mask in one pass.
  static void rgb_to_planar(const scalar_t* __restrict__ src, scalar_t* __restrict__ r, scalar_t* __restrict__ g,
                            scalar_t* __restrict__ b, const uint8_t* __restrict__ hit, int64_t width) {
    if constexpr (std::is_same<scalar_t, uint8_t>::value) {
      rgb_u8_to_planar(src, r, g, b, hit, width);
      return;
    }
    for (int64_t x = 0; x < width; ++x) {
      r[x] = masked(src[3 * x], hit[x]);
      g[x] = masked(src[3 * x + 1], hit[x]);
      b[x] = masked(src[3 * x + 2], hit[x]);
    }
  }
};

// Writes row y of dst: src's row with the dilated pixels zeroed. dst may be src itself (in place).
template <typename scalar_t>
struct RowMasker {
  using R = Runs<scalar_t>;
  View<scalar_t> src, dst;
  bool in_place;
  std::vector<uint8_t> spread;  // hit flags spread over channels, for interleaved rows

  RowMasker(const at::Tensor& source, const at::Tensor& target)
      : src(source), dst(target), in_place(source.data_ptr() == target.data_ptr()) {
    spread.resize(static_cast<size_t>(dst.width * dst.channels));
  }

  void operator()(int64_t y, const uint8_t* hit) {
    const int64_t channels = dst.channels, width = dst.width;
    scalar_t* s = src.data + y * src.sh;
    scalar_t* d = dst.data + y * dst.sh;
    if (src.planar() && dst.planar()) {
      for (int64_t c = 0; c < channels; ++c) {
        if (in_place) R::in_place(d + c * dst.sc, hit, width);
        else R::copy(s + c * src.sc, d + c * dst.sc, hit, width);
      }
    } else if (!in_place && dst.planar() && src.rgb_interleaved()) {
      R::rgb_to_planar(s, d, d + dst.sc, d + 2 * dst.sc, hit, width);
    } else if (in_place && dst.rgb_interleaved() && R::kMultiply) {
      R::rgb_in_place(d, hit, width);
    } else if (src.interleaved() && dst.interleaved()) {  // one run of W * C values
      uint8_t* flags = spread.data();
      for (int64_t x = 0; x < width; ++x)
        for (int64_t c = 0; c < channels; ++c) flags[x * channels + c] = hit[x];
      if (in_place) R::in_place(d, flags, width * channels);
      else R::copy(s, d, flags, width * channels);
    } else {
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t x = 0; x < width; ++x)
          d[c * dst.sc + x * dst.sw] = R::masked(s[c * src.sc + x * src.sw], hit[x]);
    }
  }
};

void check_image(const at::Tensor& img, const char* op) {
  TORCH_CHECK(img.device().is_cpu(), "fastpipe::", op, ": img must be a CPU tensor, got ", img.device());
  TORCH_CHECK(img.dim() == 2 || img.dim() == 3, "fastpipe::", op, ": img must be (C, H, W) or (H, W), got shape ", img.sizes());
}

// Rows of draws for y-1, y, y+1, rotated as y advances; fill(row, y) writes row y at offset 1.
template <typename scalar_t, typename Fill>
void mask_image(const at::Tensor& src, const at::Tensor& dst, Fill fill) {
  RowMasker<scalar_t> mask_row(src, dst);
  const int64_t width = src.size(-1), height = src.size(-2);
  std::vector<uint8_t> buffer(static_cast<size_t>(4 * (width + 2)), 0);
  uint8_t* prev = buffer.data();
  uint8_t* cur = prev + (width + 2);
  uint8_t* next = cur + (width + 2);
  uint8_t* hit = next + (width + 2);
  if (height > 0) fill(cur + 1, 0);
  for (int64_t y = 0; y < height; ++y) {
    if (y + 1 < height) {
      fill(next + 1, y + 1);
    } else {
      std::memset(next, 0, static_cast<size_t>(width + 2));
    }
    dilate_row(prev, cur, next, hit, width);
    mask_row(y, hit);
    std::swap(prev, cur);  // (prev, cur, next) <- (cur, next, prev)
    std::swap(cur, next);
  }
}

void random_mask_into(const at::Tensor& src, const at::Tensor& dst, double ratio, int64_t seed) {
  const Quantized q = quantize_ratio(ratio);
  const uint64_t s = check_seed(seed);
  const int64_t width = src.size(-1);
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, src.scalar_type(), "fastpipe::random_mask", [&] {
    mask_image<scalar_t>(src, dst, [&](uint8_t* row, int64_t y) { draw_row(row, y, width, s, q); });
  });
}

void random_mask_(at::Tensor img, double ratio, int64_t seed) {
  check_image(img, "random_mask_");
  random_mask_into(img, img, ratio, seed);
}

void random_mask_out(const at::Tensor& img, double ratio, int64_t seed, at::Tensor out) {
  check_image(img, "random_mask_out");
  TORCH_CHECK(out.device().is_cpu() && out.sizes() == img.sizes() && out.scalar_type() == img.scalar_type(),
              "fastpipe::random_mask_out: out must be a CPU tensor of img's shape ", img.sizes(), " and dtype ", img.scalar_type(),
              ", got ", out.scalar_type(), " ", out.sizes());
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, img);
  random_mask_into(img, out, ratio, seed);
}

void apply_mask_(at::Tensor img, const at::Tensor& mask) {
  check_image(img, "apply_mask_");
  TORCH_CHECK(mask.device().is_cpu(), "fastpipe::apply_mask_: mask must be a CPU tensor, got ", mask.device());
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kByte,
              "fastpipe::apply_mask_: mask must be bool or uint8, got ", mask.scalar_type());
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == img.size(-2) && mask.size(1) == img.size(-1),
              "fastpipe::apply_mask_: mask must be (H, W) = ", img.size(-2), "x", img.size(-1), ", got ", mask.sizes());
  const at::Tensor draws = mask.contiguous();
  const uint8_t* base = static_cast<const uint8_t*>(draws.data_ptr());
  const int64_t width = img.size(-1);
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, img.scalar_type(), "fastpipe::apply_mask_", [&] {
    mask_image<scalar_t>(img, img, [&](uint8_t* row, int64_t y) {
      const uint8_t* src = base + y * width;
      for (int64_t x = 0; x < width; ++x) row[x] = src[x] != 0;
    });
  });
}

void draw_mask_(at::Tensor out, double ratio, int64_t seed) {
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kByte && out.dim() == 2 && out.is_contiguous(),
              "fastpipe::draw_mask_: out must be a contiguous CPU uint8 (H, W) tensor, got ", out.scalar_type(), " ", out.sizes());
  const Quantized q = quantize_ratio(ratio);
  const uint64_t s = check_seed(seed);
  uint8_t* data = out.data_ptr<uint8_t>();
  const int64_t height = out.size(0), width = out.size(1);
  for (int64_t y = 0; y < height; ++y) draw_row(data + y * width, y, width, s, q);
}

}  // namespace

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("draw_mask_", &draw_mask_);
  m.impl("apply_mask_", &apply_mask_);
  m.impl("random_mask_", &random_mask_);
  m.impl("random_mask_out", &random_mask_out);
}

}  // namespace fastpipe
