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
#include <cstdio>

#include <jpeglib.h>

namespace fastpipe {
namespace {

struct FloorErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void floor_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<FloorErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

void floor_silent(j_common_ptr) {}

struct FloorDecompressor {
  jpeg_decompress_struct cinfo;
  FloorErrorManager err;
  FloorDecompressor() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = floor_error_exit;
    err.pub.output_message = floor_silent;
    err.message[0] = '\0';
    jpeg_create_decompress(&cinfo);
  }
  ~FloorDecompressor() { jpeg_destroy_decompress(&cinfo); }
  FloorDecompressor(const FloorDecompressor&) = delete;
  FloorDecompressor& operator=(const FloorDecompressor&) = delete;
};

// Entropy-decodes the iMCU rows that lie wholly above full-size row `bottom` (all scans for a
// progressive file) and returns how many full-size rows that covered. Rounding down to whole
// iMCU rows keeps the floor a lower bound.
int64_t jpeg_entropy_floor_cpu(const at::Tensor& data, int64_t bottom) {
  TORCH_CHECK(data.device().is_cpu() && data.dtype() == at::kByte && data.dim() == 1, "_jpeg_entropy_floor: data must be 1-D uint8 bytes on the CPU");
  const at::Tensor bytes = data.contiguous();
  FloorDecompressor d;
  jpeg_decompress_struct* cinfo = &d.cinfo;
  int64_t covered = 0;
  if (setjmp(d.err.jump)) {
    TORCH_CHECK(false, "_jpeg_entropy_floor: cannot decode the JPEG: ", d.err.message);
  }
  jpeg_mem_src(cinfo, bytes.data_ptr<uint8_t>(), static_cast<unsigned long>(bytes.numel()));
  jpeg_read_header(cinfo, TRUE);
  // 1/8 scale: an iMCU row's blocks become single pixels, so the one partial row skip_scanlines
  // may output costs next to nothing; whole rows are Huffman-decoded and discarded.
  cinfo->scale_num = 1;
  cinfo->scale_denom = 8;
  const J_COLOR_SPACE space = cinfo->jpeg_color_space;
  cinfo->out_color_space = space == JCS_GRAYSCALE ? JCS_GRAYSCALE : ((space == JCS_CMYK || space == JCS_YCCK) ? JCS_CMYK : JCS_RGB);
  jpeg_start_decompress(cinfo);  // a progressive file: every scan is entropy-decoded here
  const int64_t full_rows_per_imcu = static_cast<int64_t>(cinfo->max_v_samp_factor) * DCTSIZE;
  const int64_t scaled_rows_per_imcu = static_cast<int64_t>(cinfo->max_v_samp_factor);  // DCT_scaled_size 1
  const int64_t imcu_rows = std::min<int64_t>(bottom, cinfo->image_height) / full_rows_per_imcu;
  if (!jpeg_has_multiple_scans(cinfo) && imcu_rows > 0) {
    jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(imcu_rows * scaled_rows_per_imcu));
  }
  covered = jpeg_has_multiple_scans(cinfo) ? static_cast<int64_t>(cinfo->image_height) : imcu_rows * full_rows_per_imcu;
  return covered;  // the destructor aborts the rest of the decode
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fastpipe, m) {
  // Measurement aid for benchmarks/bench_jpeg.py: entropy-decodes what a crop reaching full-size
  // row `bottom` cannot avoid, and returns the full-size rows that covered.
  m.def("_jpeg_entropy_floor(Tensor data, int bottom) -> int");
}

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) { m.impl("_jpeg_entropy_floor", &jpeg_entropy_floor_cpu); }

}  // namespace fastpipe
