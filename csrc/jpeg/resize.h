// The decode-and-crop op's fixed-point resize passes (resize.cpp), each with a portable kernel
// and, on x86-64, an AVX2 kernel chosen at run time; both do the same integer arithmetic, so
// their output is the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastpipe {
namespace resize {

constexpr int kVerticalBits = 14;    // vertical weights: 255 << 14 fits easily in int32
constexpr int kFractionBits = 6;     // the intermediate keeps 6 fractional bits: 255 << 6 < 2**15
constexpr int kHorizontalBits = 14;  // int16 weights times the int16 intermediate, summed in int32
constexpr int kFinalShift = kFractionBits + kHorizontalBits;

enum class Kernel { kPortable, kAvx2, kSkip };

// The kernel for the next image: AVX2 when the CPU has it and the process-wide choice (set_kernel)
// is "auto" or "avx2". Read once per image, so a whole image uses one kernel.
Kernel current_kernel();

// The process-wide choice, for benchmarks and tests that compare the kernels in one run:
// "auto" (the default: AVX2 where the CPU has it), "portable", "avx2" (refused on a CPU without
// it), or "skip": a measurement aid only, the op then skips both passes and leaves its output
// unwritten, so a benchmark can tell the resize's share of the op's time. Returns the previous choice.
std::string set_kernel(const std::string& choice);

// The kernels this build and CPU can run, best first: {"avx2", "portable"} or {"portable"}.
std::vector<std::string> available_kernels();

// One output row of the vertical pass: rows[k] weighted by w[k] (k < taps, weights >= 0, each
// <= 1 << kVerticalBits), over n contiguous bytes, into n int16 with kFractionBits fractional
// bits. `acc` is n int32 of scratch (the portable kernel's running sums).
void vertical_row(Kernel kernel, const uint8_t* const* rows, const int32_t* w, int taps, int n, int32_t* acc, int16_t* out);

// The horizontal weight pairs laid out for the AVX2 kernel, once per image: for each pair of output
// pixels (2p, 2p+1) and each j, eight int32, four copies of pairs[2p * n_pairs + j] then four of
// pairs[(2p + 1) * n_pairs + j] (one 256-bit load instead of two broadcasts and a blend per pair
// of taps in the inner loop). `wide` must hold wide_pairs_size(n_pairs, out_w) int32.
size_t wide_pairs_size(int n_pairs, int out_w);
void pack_wide_pairs(const int32_t* pairs, int n_pairs, int out_w, int32_t* wide);

// One output row of the horizontal pass over an RGBX int16 row: output pixel x reads n_pairs
// pairs of pixels from row + first[x] * 4 with the weight pairs pairs[x * n_pairs + j]
// (w[2j] | w[2j+1] << 16; the flip is already in `first` and `pairs`), into three planes.
// `wide` is pack_wide_pairs' layout of `pairs` (read by the AVX2 kernel only); `rgbx` is
// out_w * 4 + 16 bytes of scratch.
void horizontal_row4(Kernel kernel, const int16_t* row, const int* first, const int32_t* pairs, const int32_t* wide, int n_pairs, int out_w,
                     uint8_t* rgbx, uint8_t* const* planes);

}  // namespace resize
}  // namespace fastpipe
