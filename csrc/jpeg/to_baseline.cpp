// fastpipe::_jpeg_to_baseline: a progressive JPEG rewritten as a baseline (sequential) one from its own
// DCT coefficients, without decoding to pixels: the quantised coefficients, quantisation tables and
// sampling factors are copied (jpeg_read_coefficients / jpeg_copy_critical_parameters /
// jpeg_write_coefficients, libjpeg's transcoding path, as jpegtran), so the decoded pixels are
// identical bit for bit; only the entropy coding changes (with optimised Huffman tables). Why:
// a progressive file must have every scan entropy-decoded, for the whole image, before any pixel of
// a crop exists; a baseline file lets the decoder skip and stop early. APPn and COM markers (EXIF,
// ICC) are kept. With restart_rows > 0, a restart marker is written every that many MCU rows (a
// measurement aid: markers would let a decoder resynchronise, but turn off libjpeg-turbo's fast
// Huffman path). Returns the new file's bytes.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "decompressor.h"

namespace fastpipe {
namespace {

using jpeg_detail::ErrorManager;

at::Tensor jpeg_to_baseline_cpu(const at::Tensor& data, int64_t restart_rows) {
  TORCH_CHECK(data.device().is_cpu() && data.dtype() == at::kByte && data.dim() == 1, "_jpeg_to_baseline: data must be 1-D uint8 bytes on the CPU");
  TORCH_CHECK(data.numel() > 2, "cannot decode the JPEG (corrupt, truncated or unsupported): only ", data.numel(), " bytes");
  TORCH_CHECK(restart_rows >= 0 && restart_rows <= 65535, "_jpeg_to_baseline: restart_rows must be in [0, 65535], got ", restart_rows);
  const at::Tensor bytes = data.contiguous();
  jpeg_decompress_struct src;
  jpeg_compress_struct dst;
  ErrorManager err;
  src.err = jpeg_std_error(&err.pub);
  dst.err = &err.pub;  // one manager, one jump buffer: both structs fail to the same place
  err.pub.error_exit = jpeg_detail::error_exit;
  err.pub.emit_message = jpeg_detail::warnings_as_errors;
  err.pub.output_message = jpeg_detail::silent_output;
  err.message[0] = '\0';
  // The output buffer jpeg_mem_dest grows (it frees the old one and stores the new one through the pointer it was
  // given): kept on the heap, not in a local that setjmp/longjmp may leave holding a stale (freed) pointer.
  struct MemDest {
    unsigned char* buffer = nullptr;
    unsigned long size = 0;
  };
  const std::unique_ptr<MemDest> dest(new MemDest());
  volatile bool src_made = false, dst_made = false;  // read after a longjmp: volatile
  volatile bool ok = false;
  if (setjmp(err.jump) == 0) {
    jpeg_create_decompress(&src);
    src_made = true;
    jpeg_create_compress(&dst);
    dst_made = true;
    jpeg_mem_src(&src, bytes.data_ptr<uint8_t>(), static_cast<unsigned long>(bytes.numel()));
    jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; ++m) jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&src);
    jpeg_copy_critical_parameters(&src, &dst);  // sequential (no scan script): baseline
    dst.optimize_coding = TRUE;                 // lossless: only the Huffman tables change
    if (restart_rows > 0) dst.restart_in_rows = static_cast<int>(restart_rows);
    jpeg_mem_dest(&dst, &dest->buffer, &dest->size);
    jpeg_write_coefficients(&dst, coefficients);
    for (jpeg_saved_marker_ptr m = src.marker_list; m != nullptr; m = m->next) {  // as jpegtran's jcopy_markers_execute
      if (dst.write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 && std::memcmp(m->data, "JFIF", 5) == 0) continue;
      if (dst.write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 && std::memcmp(m->data, "Adobe", 5) == 0) continue;
      jpeg_write_marker(&dst, m->marker, m->data, m->data_length);
    }
    jpeg_finish_compress(&dst);
    jpeg_finish_decompress(&src);
    ok = true;
  }
  if (dst_made) jpeg_destroy_compress(&dst);
  if (src_made) jpeg_destroy_decompress(&src);
  if (!ok) {
    std::free(dest->buffer);
    TORCH_CHECK(false, "cannot decode the JPEG (corrupt, truncated or unsupported): ", err.message);
  }
  at::Tensor result = at::empty({static_cast<int64_t>(dest->size)}, at::kByte);
  std::memcpy(result.data_ptr<uint8_t>(), dest->buffer, dest->size);
  std::free(dest->buffer);
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) { m.impl("_jpeg_to_baseline", &jpeg_to_baseline_cpu); }

}  // namespace fastpipe
