// fastpipe's C++ CPU ops. This file holds the module entry point and the schemas; the
// kernels live in one file per op family (random_mask.cpp) and register in
// TORCH_LIBRARY_IMPL. The Python side (fastpipe/ops) holds the typed wrappers and the fake
// kernels that torch.compile and opcheck use.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// Importing fastpipe._C from Python is what loads the library and runs the registrations below.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(fastpipe, m) {
  // RandomMask (see fastpipe/transforms/mask.py). img is (C, H, W) or (H, W), any strides and
  // dtype; ratio is quantised as fastpipe.transforms._prng.quantize_ratio does; seed in [0, 2**63).
  // The undilated Bernoulli(ratio) draw for `seed`, written into a uint8 (H, W) tensor as 0/1.
  m.def("draw_mask_(Tensor(a!) out, float ratio, int seed) -> ()");
  // Dilate a given (H, W) draw (bool or uint8) with the 4-neighbour cross and zero those pixels in every channel.
  m.def("apply_mask_(Tensor(a!) img, Tensor mask) -> ()");
  // Both in one pass: equal to apply_mask_(img, draw) for the draw draw_mask_ makes with the same seed.
  m.def("random_mask_(Tensor(a!) img, float ratio, int seed) -> ()");
  // Out of place: img masked into `out` (same shape and dtype, any strides, not overlapping img) in
  // the same single pass; a strided source, such as a crop view or HWC memory, is gathered on the way.
  m.def("random_mask_out(Tensor img, float ratio, int seed, Tensor(a!) out) -> ()");
}
