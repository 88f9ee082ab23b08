// A libjpeg decompressor whose errors come back as C++ exceptions, shared by the JPEG ops.
//
// libjpeg reports errors through error_exit, which must not return: it longjmps back to the
// setjmp of the libjpeg call in progress (see `guarded`), and the op then throws from C++ frames
// only. With `warnings_are_errors`, warnings that mean the pixels would be wrong (premature end
// of file, corrupt entropy data) are errors too, instead of the grey rows libjpeg fills in.
//
// Size limits: an op that is given a pixel limit checks the header's width x height against it
// (check_pixels, before jpeg_start_decompress allocates anything sized by the image), and caps
// libjpeg's own allocations at kBytesPerPixel per pixel of the limit (max_memory_to_use): a
// progressive file's whole-image coefficient arrays that would exceed it fail with libjpeg's
// "Backing store not supported" instead of allocating gigabytes.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <climits>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <optional>

#include <jpeglib.h>
#include <jerror.h>

namespace fastpipe {
namespace jpeg_detail {

struct ErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

inline void error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

// Warnings about metadata are harmless; every other warning means the pixels would be wrong.
inline bool harmless_warning(int code) {
  return code == JWRN_EXTRANEOUS_DATA || code == JWRN_JFIF_MAJOR || code == JWRN_ADOBE_XFORM || code == JWRN_BOGUS_ICC;
}

inline void warnings_as_errors(j_common_ptr cinfo, int level) {
  if (level < 0 && !harmless_warning(cinfo->err->msg_code)) {
    error_exit(cinfo);
  }
}

inline void silent_output(j_common_ptr) {}

// Runs `step` (plain libjpeg calls only: nothing with a destructor may be live inside it, since
// an error longjmps out of it). Returns false, with the message in `err`, if libjpeg failed.
template <typename Step>
bool guarded(ErrorManager& err, Step&& step) {
  if (setjmp(err.jump)) {
    return false;
  }
  step();
  return true;
}

// Memory allowed per pixel of the limit, for libjpeg's allocations and, separately, for an op's
// own scratch buffers. A progressive file keeps 2 bytes per sample (64 coefficients of 16 bits
// per 8x8 block) for up to 4 full-resolution components: 8 bytes a pixel; twice that leaves room
// for libjpeg's row buffers and tables.
constexpr int64_t kBytesPerPixel = 16;

// The limit as the ops receive it: none, or a positive number of pixels.
inline void check_limit_argument(const std::optional<int64_t>& max_pixels, const char* op) {
  TORCH_CHECK_VALUE(!max_pixels.has_value() || *max_pixels > 0, op, ": max_pixels must be positive or None, got ", max_pixels.value_or(0));
}

// Memory in bytes that `max_pixels` allows (kBytesPerPixel each), without overflow.
inline int64_t memory_budget(int64_t max_pixels) {
  return max_pixels > INT64_MAX / kBytesPerPixel ? INT64_MAX : max_pixels * kBytesPerPixel;
}

// Raises when the header's width x height is over the limit. Call after jpeg_read_header and
// before jpeg_start_decompress. The message carries "pixel limit", which fastpipe/ops/jpeg.py
// turns into DecompressionBombError.
inline void check_pixels(const jpeg_decompress_struct& cinfo, const std::optional<int64_t>& max_pixels, const char* op) {
  const int64_t pixels = static_cast<int64_t>(cinfo.image_width) * static_cast<int64_t>(cinfo.image_height);
  TORCH_CHECK(!max_pixels.has_value() || pixels <= *max_pixels, op, ": the header says ", cinfo.image_height, "x", cinfo.image_width,
              " = ", pixels, " pixels, over the pixel limit of ", max_pixels.value_or(0));
}

struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  // `op` names the op in the error raised when libjpeg cannot even start; `max_pixels` (none:
  // no limit) caps libjpeg's memory at kBytesPerPixel bytes per pixel of it.
  Decompressor(const char* op, bool warnings_are_errors, const std::optional<int64_t>& max_pixels = std::nullopt) {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = error_exit;
    if (warnings_are_errors) err.pub.emit_message = warnings_as_errors;
    err.pub.output_message = silent_output;
    err.message[0] = '\0';
    // jpeg_create_decompress fails when the libjpeg loaded at run time does not match the headers
    // built against; its error must land here, not on an unset jump buffer. Throwing from the
    // constructor skips the destructor, which must not run on a struct that was never created.
    if (setjmp(err.jump)) {
      TORCH_CHECK(false, op, ": cannot start libjpeg: ", err.message);
    }
    jpeg_create_decompress(&cinfo);
    if (max_pixels.has_value()) {
      cinfo.mem->max_memory_to_use = static_cast<long>(std::min<int64_t>(memory_budget(*max_pixels), LONG_MAX));
    }
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo); }  // also aborts a decode stopped early
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
};

}  // namespace jpeg_detail
}  // namespace fastpipe
