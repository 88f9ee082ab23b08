// fastpipe::decode_jpeg_crop: decode only a crop of a JPEG with libjpeg-turbo and resize it in
// the same call, so a training sample never pays for the pixels its crop throws away.
//
// Decoding: the DCT scale (1/8, 1/4, 1/2) is the coarsest at which the box still covers the
// output size; jpeg_crop_scanline narrows the decoded columns to the box (widened by libjpeg to
// an iMCU boundary: the returned offset is used), jpeg_skip_scanlines skips the rows above it
// (entropy-decoded, but no IDCT or colour conversion), and decoding stops after the box's last
// row. The box in the scaled image is the original box / scale, keeping sub-pixel offsets.
//
// Resizing: PIL's BILINEAR ("triangle filter, support scaled by the shrink factor") with PIL's
// own coefficient rules (precompute_coeffs in Pillow's Resample.c), separable, in fixed point:
// a vertical pass over whole RGBX rows into a 16-bit intermediate with 6 fractional bits, then
// a horizontal pass (_mm_madd_epi16-style pairs: two taps and four channels per instruction)
// whose RGBX result is split into the planar CHW output; both passes live in resize.cpp, which
// picks an AVX2 or a portable kernel at run time (the same bytes either way); the flip is fused by listing
// the output pixels' taps in reverse. PIL rounds to uint8 between its passes and runs them in the
// other order, so results differ from PIL by rounding (see fastpipe/ops/jpeg.py for the tolerance).
//
// Errors: libjpeg's error_exit longjmps back here and becomes a c10::Error with libjpeg's
// message. Warnings that mean the data is damaged (premature end of file, corrupt entropy data)
// are errors too, instead of the grey rows libjpeg would otherwise fill in.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "decode_jpeg_crop.h"
#include "decompressor.h"
#include "resize.h"
#include "../clones.h"  // FASTPIPE_CLONES: AVX2 and baseline, picked at load time

namespace fastpipe {
namespace {

using jpeg_detail::Decompressor;
using jpeg_detail::ErrorManager;
using jpeg_detail::guarded;

[[noreturn]] void fail(const ErrorManager& err) {
  TORCH_CHECK(false, "cannot decode the JPEG (corrupt, truncated or unsupported): ", err.message);
}

// ---------------------------------------------------------------------------------------------
// PIL's BILINEAR coefficients (Pillow's Resample.c, precompute_coeffs), quantised to `bits`.

struct Coefficients {
  int ksize = 0;
  std::vector<int> first;    // first input index for each output index
  std::vector<int> count;    // taps for each output index
  std::vector<int32_t> weights;  // ksize per output index, zero padded
  int lo = 0, hi = 0;        // input range [lo, hi) that any output uses
  std::vector<double> taps;  // precompute's scratch: one output's unnormalised weights
};

// Fills `c`, reusing its vectors' memory (the op keeps one per axis per thread: no allocation per image).
void precompute(Coefficients& c, int in_size, double in0, double in1, int out_size, int bits) {
  // PIL receives the box as C floats.
  const double start = static_cast<float>(in0), end = static_cast<float>(in1);
  const double scale = (end - start) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the triangle filter's support is 1
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  c.taps.resize(c.ksize);
  double* w = c.taps.data();
  c.lo = in_size;
  c.hi = 0;
  const double one = static_cast<double>(1 << bits);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = start + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    xmax = std::min(xmax, c.ksize);
    double total = 0.0;
    for (int x = 0; x < xmax; ++x) {
      double t = std::fabs((x + xmin - center + 0.5) * ss);
      w[x] = t < 1.0 ? 1.0 - t : 0.0;
      total += w[x];
    }
    int32_t* weights = &c.weights[static_cast<size_t>(xx) * c.ksize];
    if (xmax <= 0 || total == 0.0) {
      // No input pixel under the filter (cannot happen for a box inside the image): every output
      // pixel still reads one tap, the nearest pixel, so no pass ever reads an empty tap list.
      xmin = std::min(std::max(static_cast<int>(center), 0), in_size - 1);
      xmax = 1;
      std::fill(weights, weights + c.ksize, 0);
      weights[0] = static_cast<int32_t>(one);
    } else {
      for (int x = 0; x < xmax; ++x) {
        const double v = w[x] / total;
        weights[x] = static_cast<int32_t>(v < 0 ? -0.5 + v * one : 0.5 + v * one);
      }
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
    c.lo = std::min(c.lo, xmin);
    c.hi = std::max(c.hi, xmin + xmax);
  }
}

using resize::kFinalShift;
using resize::kHorizontalBits;
using resize::kVerticalBits;

#define FASTPIPE_INLINE inline __attribute__((always_inline))

inline uint8_t clip8(int32_t v) {
  v >>= kFinalShift;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// One output row of the horizontal pass over a row of C interleaved channels (C = 4 for RGBX,
// whose 4th channel is computed and dropped: four lanes vectorise where three do not), with
// exactly K taps per output pixel (the weights are zero padded and the row has K pixels of
// slack at its end), into the first min(C, 3) planes.
template <int C, int K>
FASTPIPE_INLINE void horizontal_row_k(const int16_t* row, const int* first, const int16_t* weights, int out_w, bool hflip,
                                      uint8_t* const* planes) {
  constexpr int32_t half = 1 << (kFinalShift - 1);
  constexpr int P = C < 3 ? C : 3;
  for (int xo = 0; xo < out_w; ++xo) {
    const int16_t* w = weights + static_cast<size_t>(xo) * K;
    const int16_t* src = row + static_cast<size_t>(first[xo]) * C;
    int32_t acc[C];
    for (int c = 0; c < C; ++c) acc[c] = half;
    for (int k = 0; k < K; ++k) {
      for (int c = 0; c < C; ++c) acc[c] += static_cast<int32_t>(w[k]) * static_cast<int32_t>(src[k * C + c]);
    }
    const int xd = hflip ? out_w - 1 - xo : xo;
    for (int c = 0; c < P; ++c) planes[c][xd] = clip8(acc[c]);
  }
}

template <int C>
FASTPIPE_INLINE void horizontal_row_any(const int16_t* row, const int* first, const int16_t* weights, int ksize, int out_w, bool hflip,
                                        uint8_t* const* planes) {
  constexpr int32_t half = 1 << (kFinalShift - 1);
  constexpr int P = C < 3 ? C : 3;
  for (int xo = 0; xo < out_w; ++xo) {
    const int16_t* w = weights + static_cast<size_t>(xo) * ksize;
    const int16_t* src = row + static_cast<size_t>(first[xo]) * C;
    int32_t acc[C];
    for (int c = 0; c < C; ++c) acc[c] = half;
    for (int k = 0; k < ksize; ++k) {
      for (int c = 0; c < C; ++c) acc[c] += static_cast<int32_t>(w[k]) * static_cast<int32_t>(src[k * C + c]);
    }
    const int xd = hflip ? out_w - 1 - xo : xo;
    for (int c = 0; c < P; ++c) planes[c][xd] = clip8(acc[c]);
  }
}

template <int C>
FASTPIPE_INLINE void horizontal_dispatch(const int16_t* row, const int* first, const int16_t* weights, int ksize, int out_w, bool hflip,
                                         uint8_t* const* planes) {
  switch (ksize) {  // ksize = 2 * ceil(shrink factor) + 1: 3 when enlarging, 5 up to 2x shrink
    case 3: return horizontal_row_k<C, 3>(row, first, weights, out_w, hflip, planes);
    case 5: return horizontal_row_k<C, 5>(row, first, weights, out_w, hflip, planes);
    case 7: return horizontal_row_k<C, 7>(row, first, weights, out_w, hflip, planes);
    default: return horizontal_row_any<C>(row, first, weights, ksize, out_w, hflip, planes);
  }
}

FASTPIPE_CLONES
void horizontal_row1(const int16_t* row, const int* first, const int16_t* weights, int ksize, int out_w, bool hflip, uint8_t* const* planes) {
  horizontal_dispatch<1>(row, first, weights, ksize, out_w, hflip, planes);
}

// PIL's convert("RGB") of a CMYK JPEG, which it reads with Adobe's inverted polarity ("CMYK;I").
inline uint8_t muldiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

void cmyk_to_rgbx(const uint8_t* in, uint8_t* out, int n) {
  for (int i = 0; i < n; ++i, in += 4, out += 4) {
    out[3] = 255;
    const int nk = in[3];  // 255 - K, where PIL's K = 255 - the stored value
    for (int c = 0; c < 3; ++c) {
      const int v = nk - muldiv255(255 - in[c], nk);
      out[c] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  }
}

// Buffers reused across calls on the same thread: a fresh half-megabyte buffer per image would
// cost page faults, and the decoded pixels need no zeroing.
struct Scratch {
  std::vector<uint8_t> pixels, cmyk_row, rgbx;
  std::vector<int16_t> mid, hweights;
  std::vector<int32_t> acc, pairs, wide;
  std::vector<int> hfirst, pair_first;
  std::vector<const uint8_t*> taps;
  Coefficients vert, horiz;
  template <typename T>
  static T* at_least(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};

// This thread's scratch, reached through a plain reference: a thread_local used directly is
// re-addressed (__tls_get_addr in a shared library) at many of its uses inside the op's loops.
__attribute__((noinline)) Scratch& thread_scratch() {
  thread_local Scratch buffers;
  return buffers;
}

// ---------------------------------------------------------------------------------------------

}  // namespace

// The op's work on raw memory, shared with the batch op (decode_batch.cpp): see decode_jpeg_crop.h.
void decode_jpeg_crop_into(const uint8_t* buffer, int64_t nbytes, int64_t top, int64_t left, int64_t height, int64_t width, int64_t out_h,
                           int64_t out_w, bool hflip, const std::optional<int64_t>& max_pixels, uint8_t* base) {
  TORCH_CHECK(out_h > 0 && out_w > 0 && out_h <= 65535 && out_w <= 65535, "decode_jpeg_crop: output size must be positive and at most 65535, got ", out_h, "x", out_w);
  TORCH_CHECK(height > 0 && width > 0 && top >= 0 && left >= 0, "decode_jpeg_crop: crop box (top=", top, ", left=", left, ", height=", height,
              ", width=", width, ") must have top, left >= 0 and a positive size");
  jpeg_detail::check_limit_argument(max_pixels, "decode_jpeg_crop");
  TORCH_CHECK(!max_pixels.has_value() || out_h * out_w <= *max_pixels, "decode_jpeg_crop: the output size ", out_h, "x", out_w,
              " is over the pixel limit of ", max_pixels.value_or(0));
  TORCH_CHECK(nbytes > 2, "cannot decode the JPEG (corrupt, truncated or unsupported): only ", nbytes, " bytes");

  Decompressor d("decode_jpeg_crop", /*warnings_are_errors=*/true, max_pixels);
  jpeg_decompress_struct* cinfo = &d.cinfo;
  const unsigned long size = static_cast<unsigned long>(nbytes);
  if (!guarded(d.err, [&] {
        jpeg_mem_src(cinfo, buffer, size);
        jpeg_read_header(cinfo, TRUE);
      })) {
    fail(d.err);
  }
  jpeg_detail::check_pixels(*cinfo, max_pixels, "decode_jpeg_crop");
  const int64_t image_h = cinfo->image_height, image_w = cinfo->image_width;
  // Compared without adding, so no box can overflow: top, left >= 0 and height, width > 0 here.
  TORCH_CHECK(top <= image_h - height && left <= image_w - width, "decode_jpeg_crop: crop box (top=", top, ", left=", left, ", height=", height,
              ", width=", width, ") is not inside the ", image_h, "x", image_w, " image");

  // The DCT scale is num / 8: the coarsest of 1/8, 1/4, 1/2 at which the box still covers the output.
  int num = 8;
  for (int m : {1, 2, 4}) {
    if (width * m >= out_w * 8 && height * m >= out_h * 8) {
      num = m;
      break;
    }
  }
  const double denom = 8.0 / num;
  int channels = 4;  // RGBX: four lanes vectorise in the horizontal pass
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  if (cinfo->jpeg_color_space == JCS_GRAYSCALE) {
    cinfo->out_color_space = JCS_GRAYSCALE;
    channels = 1;
  } else if (cmyk) {
    cinfo->out_color_space = JCS_CMYK;
  } else {
    cinfo->out_color_space = JCS_EXT_RGBX;
  }
  cinfo->scale_num = static_cast<unsigned int>(num);
  cinfo->scale_denom = 8;
  cinfo->dct_method = JDCT_ISLOW;  // what PIL and torchvision use

  if (!guarded(d.err, [&] { jpeg_start_decompress(cinfo); })) fail(d.err);

  // The box in the scaled image keeps its sub-pixel offsets.
  const int scaled_w = static_cast<int>(cinfo->output_width), scaled_h = static_cast<int>(cinfo->output_height);
  Scratch& buffers = thread_scratch();
  precompute(buffers.vert, scaled_h, double(top) / denom, double(top + height) / denom, static_cast<int>(out_h), kVerticalBits);
  precompute(buffers.horiz, scaled_w, double(left) / denom, double(left + width) / denom, static_cast<int>(out_w), kHorizontalBits);
  const Coefficients& vert = buffers.vert;
  const Coefficients& horiz = buffers.horiz;

  // One column of margin each side: fancy (interpolating) chroma upsampling treats the edges of
  // the decoded window as image edges, so the window's outermost columns differ from a full decode.
  const int want_lo = std::max(horiz.lo - 1, 0), want_hi = std::min(horiz.hi + 1, scaled_w);
  JDIMENSION xoffset = static_cast<JDIMENSION>(want_lo);
  JDIMENSION crop_w = static_cast<JDIMENSION>(want_hi - want_lo);
  const JDIMENSION skip = static_cast<JDIMENSION>(vert.lo);
  const int rows = vert.hi - vert.lo;
  if (crop_w >= cinfo->output_width) xoffset = 0;  // the whole width: no crop
  if (!guarded(d.err, [&] {
        if (crop_w < cinfo->output_width) jpeg_crop_scanline(cinfo, &xoffset, &crop_w);
        if (skip > 0) jpeg_skip_scanlines(cinfo, skip);
      })) {
    fail(d.err);
  }
  const int decoded_w = static_cast<int>(cinfo->output_width);  // crop_w as libjpeg widened it
  const int components = cinfo->output_components;
  TORCH_CHECK(components == channels, "decode_jpeg_crop: unexpected ", components, " output components");

  // The op's own scratch memory (the decoded rows, then the int16 intermediate of the vertical
  // pass), checked against the budget the limit allows before any of it is allocated.
  const size_t stride = static_cast<size_t>(decoded_w) * channels;
  const int64_t padded_row = static_cast<int64_t>(horiz.hi - horiz.lo + horiz.ksize) * channels;
  const int64_t scratch_bytes = static_cast<int64_t>(stride) * rows + out_h * padded_row * static_cast<int64_t>(sizeof(int16_t));
  TORCH_CHECK(!max_pixels.has_value() || scratch_bytes <= jpeg_detail::memory_budget(*max_pixels), "decode_jpeg_crop: resizing the ",
              height, "x", width, " box to ", out_h, "x", out_w, " needs ", scratch_bytes >> 20, " MiB of scratch memory, over the ",
              jpeg_detail::memory_budget(*max_pixels) >> 20, " MiB that the pixel limit of ", max_pixels.value_or(0), " allows");

  // Decode the box's rows; CMYK rows go through a scratch row and PIL's conversion.
  uint8_t* pixels_ptr = Scratch::at_least(buffers.pixels, stride * rows);
  uint8_t* scratch_ptr = cmyk ? Scratch::at_least(buffers.cmyk_row, static_cast<size_t>(decoded_w) * 4) : nullptr;
  int rows_read = 0;
  if (!guarded(d.err, [&] {
        for (; rows_read < rows; ++rows_read) {
          JSAMPROW row = cmyk ? scratch_ptr : pixels_ptr + stride * rows_read;
          if (jpeg_read_scanlines(cinfo, &row, 1) != 1) return;
          if (cmyk) cmyk_to_rgbx(scratch_ptr, pixels_ptr + stride * rows_read, decoded_w);
        }
      })) {
    fail(d.err);
  }
  TORCH_CHECK(rows_read == rows, "cannot decode the JPEG (corrupt, truncated or unsupported): libjpeg returned no data at row ",
              vert.lo + rows_read);
  // Stop here: the Decompressor's destructor aborts the decode of the rows below the box.

  // Vertical pass over the columns the horizontal pass reads, into rows with ksize pixels of
  // zeroed slack so that every output pixel reads exactly ksize taps.
  const int col0 = horiz.lo - static_cast<int>(xoffset);
  const int n = (horiz.hi - horiz.lo) * channels;
  const int padded = n + horiz.ksize * channels;
  int16_t* mid = Scratch::at_least(buffers.mid, static_cast<size_t>(out_h) * padded);
  int32_t* acc = Scratch::at_least(buffers.acc, static_cast<size_t>(n));
  const resize::Kernel kernel = resize::current_kernel();  // one kernel for the whole image (resize.cpp)
  const int resized_rows = kernel == resize::Kernel::kSkip ? 0 : static_cast<int>(out_h);  // skip: a timing aid, output unwritten
  const uint8_t** taps = Scratch::at_least(buffers.taps, static_cast<size_t>(vert.ksize));
  for (int y = 0; y < resized_rows; ++y) {
    const int count = vert.count[y];
    for (int k = 0; k < count; ++k) {
      taps[k] = pixels_ptr + stride * (vert.first[y] - vert.lo + k) + static_cast<size_t>(col0) * channels;
    }
    int16_t* row = mid + static_cast<size_t>(y) * padded;
    resize::vertical_row(kernel, taps, &vert.weights[static_cast<size_t>(y) * vert.ksize], count, n, acc, row);
    std::memset(row + n, 0, sizeof(int16_t) * (padded - n));
  }

  // Horizontal pass into the planes, flipped if asked.
  int16_t* hweights = Scratch::at_least(buffers.hweights, horiz.weights.size());
  std::copy(horiz.weights.begin(), horiz.weights.end(), hweights);  // <= 1 << 14: fits
  int* hfirst = Scratch::at_least(buffers.hfirst, static_cast<size_t>(out_w));
  for (int x = 0; x < out_w; ++x) hfirst[x] = horiz.first[x] - horiz.lo;
  // The same weights as int32 pairs (w[2j] | w[2j+1] << 16) for the RGBX kernels' madd (resize.h).
  const int n_pairs = (horiz.ksize + 1) / 2;
  int32_t* pairs = Scratch::at_least(buffers.pairs, static_cast<size_t>(out_w) * n_pairs);
  int* pair_first = Scratch::at_least(buffers.pair_first, static_cast<size_t>(out_w));
  for (int xd = 0; xd < out_w; ++xd) {
    const int x = hflip ? static_cast<int>(out_w) - 1 - xd : xd;  // the flip, fused: output xd reads source pixel x's taps
    pair_first[xd] = hfirst[x];
    for (int j = 0; j < n_pairs; ++j) {
      const int k = 2 * j;
      const uint32_t lo = static_cast<uint16_t>(hweights[static_cast<size_t>(x) * horiz.ksize + k]);
      const uint32_t hi = k + 1 < horiz.ksize ? static_cast<uint16_t>(hweights[static_cast<size_t>(x) * horiz.ksize + k + 1]) : 0u;
      pairs[static_cast<size_t>(xd) * n_pairs + j] = static_cast<int32_t>(lo | (hi << 16));
    }
  }
  int32_t* wide = nullptr;  // the AVX2 kernel's layout of the same pairs (resize.h)
  if (kernel == resize::Kernel::kAvx2 && channels == 4) {
    wide = Scratch::at_least(buffers.wide, resize::wide_pairs_size(n_pairs, static_cast<int>(out_w)));
    resize::pack_wide_pairs(pairs, n_pairs, static_cast<int>(out_w), wide);
  }
  uint8_t* rgbx = Scratch::at_least(buffers.rgbx, static_cast<size_t>(out_w) * 4 + 16);
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  for (int y = 0; y < resized_rows; ++y) {
    const int16_t* row = mid + static_cast<size_t>(y) * padded;
    uint8_t* planes[3] = {base + static_cast<size_t>(y) * out_w, base + plane + static_cast<size_t>(y) * out_w,
                          base + 2 * plane + static_cast<size_t>(y) * out_w};
    if (channels == 4) {
      resize::horizontal_row4(kernel, row, pair_first, pairs, wide, n_pairs, static_cast<int>(out_w), rgbx, planes);
    } else {
      horizontal_row1(row, hfirst, hweights, horiz.ksize, static_cast<int>(out_w), hflip, planes);
    }
  }
  if (channels == 1 && resized_rows > 0) {  // greyscale expands to three equal channels, as PIL's convert("RGB")
    std::memcpy(base + plane, base, plane);
    std::memcpy(base + 2 * plane, base, plane);
  }
  // Keep the buffers for the next image, unless a huge one grew them: a worker should not hold on to
  // tens of megabytes for the rare large photo.
  constexpr size_t kKeepBytes = size_t{16} << 20;
  if (buffers.pixels.capacity() > kKeepBytes) std::vector<uint8_t>().swap(buffers.pixels);
  if (buffers.mid.capacity() * sizeof(int16_t) > kKeepBytes) std::vector<int16_t>().swap(buffers.mid);
}

namespace {

at::Tensor decode_jpeg_crop_cpu(const at::Tensor& data, int64_t top, int64_t left, int64_t height, int64_t width,
                                int64_t out_h, int64_t out_w, bool hflip, std::optional<int64_t> max_pixels) {
  TORCH_CHECK(data.device().is_cpu(), "decode_jpeg_crop: data must be on the CPU, got ", data.device());
  TORCH_CHECK(data.dtype() == at::kByte && data.dim() == 1, "decode_jpeg_crop: data must be the file's bytes as a 1-D uint8 tensor, got ",
              data.dtype(), " with ", data.dim(), " dimensions");
  TORCH_CHECK(out_h > 0 && out_w > 0 && out_h <= 65535 && out_w <= 65535, "decode_jpeg_crop: output size must be positive and at most 65535, got ", out_h, "x", out_w);
  const at::Tensor bytes = data.contiguous();
  at::Tensor out = at::empty({3, out_h, out_w}, at::kByte);
  decode_jpeg_crop_into(bytes.data_ptr<uint8_t>(), bytes.numel(), top, left, height, width, out_h, out_w, hflip, max_pixels,
                        out.data_ptr<uint8_t>());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) { m.impl("decode_jpeg_crop", &decode_jpeg_crop_cpu); }

}  // namespace fastpipe
