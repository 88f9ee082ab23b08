// fastpipe::_jpeg_entropy_floor: the part of a crop decode that no libjpeg-based decoder can skip.
//
// A JPEG without restart markers is one Huffman-coded stream: to reach the rows of a crop box,
// a decoder must entropy-decode every block above them (libjpeg's jpeg_skip_scanlines does only
// that), and a progressive file must have all of its scans entropy-decoded before any pixel
// exists. This op does exactly that much and nothing else: no inverse DCT, no colour conversion,
// no resize. benchmarks/bench_jpeg.py times it beside decode_jpeg_crop, so a speed goal can be
// checked against the floor it would have to beat, measured in the same run. It is a
// measurement aid, not part of any pipeline.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <csetjmp>

#include "decompressor.h"

namespace fastpipe {
namespace {

using jpeg_detail::Decompressor;

// Entropy-decodes the iMCU rows that lie wholly above full-size row `bottom` (all scans for a
// progressive file) and returns how many full-size rows libjpeg reports it has decoded. Rounding
// down to whole iMCU rows keeps the floor a lower bound.
int64_t jpeg_entropy_floor_cpu(const at::Tensor& data, int64_t bottom, std::optional<int64_t> max_pixels) {
  TORCH_CHECK(data.device().is_cpu() && data.dtype() == at::kByte && data.dim() == 1, "_jpeg_entropy_floor: data must be 1-D uint8 bytes on the CPU");
  jpeg_detail::check_limit_argument(max_pixels, "_jpeg_entropy_floor");
  TORCH_CHECK(data.numel() > 2, "_jpeg_entropy_floor: cannot decode the JPEG: only ", data.numel(), " bytes");
  const at::Tensor bytes = data.contiguous();
  Decompressor d("_jpeg_entropy_floor", /*warnings_are_errors=*/false, max_pixels);  // a floor, not a validator
  jpeg_decompress_struct* cinfo = &d.cinfo;
  unsigned char last_row[4 * 8192];  // one row at 1/8 scale: up to 65535 / 8 pixels of 4 components
  if (setjmp(d.err.jump)) {
    TORCH_CHECK(false, "_jpeg_entropy_floor: cannot decode the JPEG: ", d.err.message);
  }
  jpeg_mem_src(cinfo, bytes.data_ptr<uint8_t>(), static_cast<unsigned long>(bytes.numel()));
  jpeg_read_header(cinfo, TRUE);
  // From the header, before jpeg_start_decompress allocates anything sized by the image.
  jpeg_detail::check_pixels(*cinfo, max_pixels, "_jpeg_entropy_floor");
  // 1/8 scale: an iMCU row's blocks become single pixels, so the one row read at the end costs
  // next to nothing; whole rows skipped are Huffman-decoded and discarded.
  cinfo->scale_num = 1;
  cinfo->scale_denom = 8;
  const J_COLOR_SPACE space = cinfo->jpeg_color_space;
  cinfo->out_color_space = space == JCS_GRAYSCALE ? JCS_GRAYSCALE : ((space == JCS_CMYK || space == JCS_YCCK) ? JCS_CMYK : JCS_RGB);
  jpeg_start_decompress(cinfo);  // a progressive file: every scan is entropy-decoded here
  if (jpeg_has_multiple_scans(cinfo)) {
    return static_cast<int64_t>(cinfo->image_height);  // the destructor aborts the output pass
  }
  const int64_t full_rows_per_imcu = static_cast<int64_t>(cinfo->max_v_samp_factor) * DCTSIZE;
  const int64_t scaled_rows_per_imcu = static_cast<int64_t>(cinfo->max_v_samp_factor);  // DCT_scaled_size 1
  const int64_t imcu_rows = std::min<int64_t>(bottom, cinfo->image_height) / full_rows_per_imcu;
  const int64_t lines = imcu_rows * scaled_rows_per_imcu;
  const int64_t height = cinfo->output_height;
  if (lines >= height) {
    // Skipping to the very end is a shortcut in libjpeg-turbo that decodes nothing: skip all but
    // the last row and decode that one, as a crop reaching the bottom must.
    if (height > 1) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(height - 1));
    JSAMPROW row = last_row;
    TORCH_CHECK(static_cast<size_t>(cinfo->output_width) * cinfo->output_components <= sizeof(last_row), "_jpeg_entropy_floor: image too wide");
    jpeg_read_scanlines(cinfo, &row, 1);
  } else if (lines > 0) {
    jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(lines));
  }
  // libjpeg's own count of the iMCU rows whose data it has consumed, so a skip that decoded
  // nothing shows up as such.
  return std::min<int64_t>(static_cast<int64_t>(cinfo->input_iMCU_row) * full_rows_per_imcu, cinfo->image_height);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastpipe, m) {
  // Measurement aid for benchmarks/bench_jpeg.py: entropy-decodes what a crop reaching full-size
  // row `bottom` cannot avoid, and returns the full-size rows that covered.
  // max_pixels (None: no limit): as decode_jpeg_crop's.
  m.def("_jpeg_entropy_floor(Tensor data, int bottom, int? max_pixels=None) -> int");
}

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) { m.impl("_jpeg_entropy_floor", &jpeg_entropy_floor_cpu); }

}  // namespace fastpipe
