// The optional extension fastpipe._jpeg: the decode-and-crop op on libjpeg-turbo.
//
// It is a separate library from fastpipe._C so that a machine without libjpeg's headers still
// builds the other ops; the op joins the same `fastpipe` namespace through a fragment. The
// Python side (fastpipe/ops/jpeg.py) holds the typed wrappers, the PIL fallback and the fake kernel.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// Importing fastpipe._jpeg from Python is what loads the library and runs the registrations below.
PyObject* PyInit__jpeg(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_jpeg", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY_FRAGMENT(fastpipe, m) {
  // data: the file's bytes, 1-D uint8. The box (top, left, height, width) is in pixels of the
  // full-size image and must lie inside it. Returns the box resized to (3, out_h, out_w) uint8,
  // RGB, CHW, with PIL's BILINEAR filter (antialiased when shrinking), flipped left-right if hflip.
  // max_pixels (None: no limit) refuses, from the header, an image of more pixels, an output of
  // more pixels, and caps libjpeg's memory and the op's scratch memory (see decompressor.h);
  // fastpipe.ops.jpeg passes its setting (set_max_image_pixels).
  m.def(
      "decode_jpeg_crop(Tensor data, int top, int left, int height, int width, int out_h, int out_w, bool hflip, int? max_pixels=None) "
      "-> Tensor");
  // The same for a batch (decode_batch.cpp), by `threads` native threads: data[i] with boxes[i]
  // (int64 (N, 4): top, left, height, width) and hflip[i] (bool (N,)), into a new uint8
  // (N, 3, out_h, out_w) tensor, or into `out` (the caller's contiguous uint8 (N, 3, H, W)).
  // Returns the int32 status per file (0: decoded; else failed, its planes left unwritten).
  m.def(
      "decode_jpeg_crop_batch(Tensor[] data, Tensor boxes, Tensor hflip, int out_h, int out_w, int threads=1, int? max_pixels=None) "
      "-> (Tensor, Tensor)");
  m.def(
      "decode_jpeg_crop_batch_out(Tensor[] data, Tensor boxes, Tensor hflip, Tensor(a!) out, int threads=1, int? max_pixels=None) "
      "-> Tensor");
  // A progressive JPEG's bytes rewritten as baseline from its own DCT coefficients (to_baseline.cpp):
  // pixels identical; restart_rows > 0 adds a restart marker every that many MCU rows.
  m.def("_jpeg_to_baseline(Tensor data, int restart_rows=0) -> Tensor");
}
