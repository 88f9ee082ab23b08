// The decode-and-crop op's work on raw memory, for the ops that call it per image
// (decode_jpeg_crop.cpp's single op, decode_batch.cpp's batch op).
#pragma once

#include <cstdint>
#include <optional>

namespace fastpipe {

// Decodes the box (top, left, height, width) of the JPEG in buffer[0, nbytes), resized to
// out_h x out_w and flipped if hflip, into `out`: 3 planes of out_h * out_w bytes (RGB, CHW).
// Throws c10::Error (libjpeg's message, or the argument or limit that was wrong). Safe to call
// from several threads at once: each thread keeps its own scratch buffers.
void decode_jpeg_crop_into(const uint8_t* buffer, int64_t nbytes, int64_t top, int64_t left, int64_t height, int64_t width, int64_t out_h,
                           int64_t out_w, bool hflip, const std::optional<int64_t>& max_pixels, uint8_t* out);

}  // namespace fastpipe
