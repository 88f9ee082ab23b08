// A libjpeg decompressor whose errors come back as C++ exceptions, shared by the JPEG ops.
//
// libjpeg reports errors through error_exit, which must not return: it longjmps back to the
// setjmp of the libjpeg call in progress (see `guarded`), and the op then throws from C++ frames
// only. With `warnings_are_errors`, warnings that mean the pixels would be wrong (premature end
// of file, corrupt entropy data) are errors too, instead of the grey rows libjpeg fills in.
#pragma once

#include <c10/util/Exception.h>

#include <csetjmp>
#include <cstdio>

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

struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  // `op` names the op in the error raised when libjpeg cannot even start.
  Decompressor(const char* op, bool warnings_are_errors) {
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
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo); }  // also aborts a decode stopped early
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
};

}  // namespace jpeg_detail
}  // namespace fastpipe
