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
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
};

// Mirrors fastpipe.transforms._prng.quantize_ratio exactly (the same double arithmetic).
Quantized quantize_ratio(double ratio) {
  TORCH_CHECK(ratio >= 0.0 && ratio <= 1.0, "fastpipe::RandomMask: ratio must be in [0, 1], got ", ratio);
  for (int bits : {1, 2, 4, 8, 16}) {
    const double scaled = ratio * static_cast<double>(1 << bits);
    if (scaled == std::floor(scaled)) return {bits, static_cast<uint64_t>(scaled)};
  }
  return {16, static_cast<uint64_t>(std::floor(ratio * 65536.0 + 0.5))};
}

uint64_t check_seed(int64_t seed) {
  TORCH_CHECK(seed >= 0, "fastpipe::RandomMask: seed must be in [0, 2**63), got ", seed);
  return static_cast<uint64_t>(seed);
}

// row[x] = 1 where pixel (y, x) is drawn, else 0, for x in [0, width).
void draw_row(uint8_t* row, int64_t y, int64_t width, uint64_t seed, Quantized q) {
  const int64_t per_word = 64 / q.bits;
  const uint64_t chunk_mask = (uint64_t{1} << q.bits) - 1;
  int64_t p = y * width;
  const int64_t end = p + width;
  while (p < end) {
    const int64_t index = p / per_word;
    uint64_t word = splitmix_word(seed, static_cast<uint64_t>(index)) >> (q.bits * (p - index * per_word));
    const int64_t stop = std::min(end, (index + 1) * per_word);
    for (; p < stop; ++p, ++row) {
      *row = static_cast<uint8_t>((word & chunk_mask) < q.threshold);
      word >>= q.bits;
    }
  }
}

// hit[x] = 4-neighbour dilation of row y, from draws of rows y-1, y, y+1 at offsets 1..W.
inline void dilate_row(const uint8_t* prev, const uint8_t* cur, const uint8_t* next, uint8_t* hit, int64_t width) {
  for (int64_t x = 0; x < width; ++x) hit[x] = cur[x] | cur[x + 1] | cur[x + 2] | prev[x + 1] | next[x + 1];
}

// A (C, H, W) image of any strides; zero_row picks the loop that vectorises for its layout.
template <typename scalar_t>
struct Image {
  scalar_t* data;
  int64_t channels, height, width, sc, sh, sw;
  std::vector<uint8_t> spread;  // hit flags spread over channels, for interleaved rows

  explicit Image(const at::Tensor& img)
      : data(img.data_ptr<scalar_t>()),
        channels(img.dim() == 3 ? img.size(0) : 1),
        height(img.size(-2)),
        width(img.size(-1)),
        sc(img.dim() == 3 ? img.stride(0) : 0),
        sh(img.stride(-2)),
        sw(img.stride(-1)) {
    if (interleaved()) spread.resize(static_cast<size_t>(width * channels));
  }

  bool interleaved() const { return channels > 1 && sc == 1 && sw == channels; }

  void zero_row(int64_t y, const uint8_t* hit) {
    const scalar_t zero = static_cast<scalar_t>(0);
    scalar_t* row = data + y * sh;
    if (sw == 1 || channels == 0) {  // planar rows: one contiguous run per channel
      for (int64_t c = 0; c < channels; ++c) {
        scalar_t* run = row + c * sc;
        for (int64_t x = 0; x < width; ++x) run[x] = hit[x] ? zero : run[x];
      }
    } else if (interleaved()) {  // HWC memory: one contiguous run of W * C values
      uint8_t* s = spread.data();
      for (int64_t x = 0; x < width; ++x)
        for (int64_t c = 0; c < channels; ++c) s[x * channels + c] = hit[x];
      for (int64_t i = 0; i < width * channels; ++i) row[i] = s[i] ? zero : row[i];
    } else {
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t x = 0; x < width; ++x)
          if (hit[x]) row[c * sc + x * sw] = zero;
    }
  }
};

void check_image(const at::Tensor& img, const char* op) {
  TORCH_CHECK(img.device().is_cpu(), "fastpipe::", op, ": img must be a CPU tensor, got ", img.device());
  TORCH_CHECK(img.dim() == 2 || img.dim() == 3, "fastpipe::", op, ": img must be (C, H, W) or (H, W), got shape ", img.sizes());
}

// Rows of draws for y-1, y, y+1, rotated as y advances; fill(row, y) writes row y at offset 1.
template <typename scalar_t, typename Fill>
void mask_image(const at::Tensor& img, Fill fill) {
  Image<scalar_t> image(img);
  const int64_t width = image.width, height = image.height;
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
    image.zero_row(y, hit);
    std::swap(prev, cur);  // (prev, cur, next) <- (cur, next, prev)
    std::swap(cur, next);
  }
}

void random_mask_(at::Tensor img, double ratio, int64_t seed) {
  check_image(img, "random_mask_");
  const Quantized q = quantize_ratio(ratio);
  const uint64_t s = check_seed(seed);
  const int64_t width = img.size(-1);
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, img.scalar_type(), "fastpipe::random_mask_", [&] {
    mask_image<scalar_t>(img, [&](uint8_t* row, int64_t y) { draw_row(row, y, width, s, q); });
  });
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
    mask_image<scalar_t>(img, [&](uint8_t* row, int64_t y) {
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
}

}  // namespace fastpipe
