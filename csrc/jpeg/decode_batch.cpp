// fastpipe::decode_jpeg_crop_batch(_out): a whole batch of decode-and-crops by a pool of native
// threads, into one uint8 (N, 3, H, W) tensor: a new one, or the caller's (a recycled, pinned or
// shared buffer), so the batch needs no collate and no copy.
//
// Why threads and not processes: the decode is C++ that needs no GIL (the dispatcher releases it
// around the call), so threads of one process decode in parallel with one copy of the dataset
// and nothing pickled. The pool is made per call (std::thread): a batch is tens of milliseconds
// of decoding, a thread's start a few microseconds, and a process forked later (a DataLoader
// worker) inherits no pool whose threads it lacks. Threads take images from one atomic counter,
// so a slow progressive file does not hold up a fixed share of the batch.
//
// Errors: a file that fails does not stop the batch. Its status is non-zero (1) and its output
// planes are left as they were; the Python wrapper (fastpipe.ops.jpeg_batch) decodes those
// files again one by one to get each message and applies the dataset's on_error choice.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "decode_jpeg_crop.h"

namespace fastpipe {
namespace {

constexpr int64_t kMaxThreads = 256;

void check_batch(const at::TensorList data, const at::Tensor& boxes, const at::Tensor& hflip, int64_t threads) {
  const int64_t n = static_cast<int64_t>(data.size());
  TORCH_CHECK(boxes.device().is_cpu() && boxes.dtype() == at::kLong && boxes.dim() == 2 && boxes.size(0) == n && boxes.size(1) == 4,
              "decode_jpeg_crop_batch: boxes must be an int64 (N, 4) CPU tensor of (top, left, height, width) with N = ", n,
              " files, got ", boxes.dtype(), " ", boxes.sizes());
  TORCH_CHECK(hflip.device().is_cpu() && hflip.dtype() == at::kBool && hflip.dim() == 1 && hflip.size(0) == n,
              "decode_jpeg_crop_batch: hflip must be a bool (N,) CPU tensor with N = ", n, " files, got ", hflip.dtype(), " ", hflip.sizes());
  TORCH_CHECK(threads >= 1 && threads <= kMaxThreads, "decode_jpeg_crop_batch: threads must be in [1, ", kMaxThreads, "], got ", threads);
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& d = data[i];
    TORCH_CHECK(d.device().is_cpu() && d.dtype() == at::kByte && d.dim() == 1,
                "decode_jpeg_crop_batch: data[", i, "] must be the file's bytes as a 1-D uint8 CPU tensor, got ", d.dtype(), " with ",
                d.dim(), " dimensions");
  }
}

// Decodes every file into `out` (N, 3, H, W) uint8 contiguous; returns the int32 status per file.
at::Tensor decode_into(const at::TensorList data, const at::Tensor& boxes, const at::Tensor& hflip, at::Tensor& out, int64_t threads,
                       const std::optional<int64_t>& max_pixels) {
  const int64_t n = static_cast<int64_t>(data.size());
  std::vector<at::Tensor> bytes(data.begin(), data.end());
  for (auto& b : bytes) b = b.contiguous();
  const at::Tensor box = boxes.contiguous();
  const at::Tensor flip = hflip.contiguous();
  at::Tensor status = at::zeros({n}, at::kInt);
  const int64_t out_h = out.size(2), out_w = out.size(3);
  const int64_t image_bytes = 3 * out_h * out_w;
  const int64_t* box_ptr = box.data_ptr<int64_t>();
  const bool* flip_ptr = flip.data_ptr<bool>();
  int32_t* status_ptr = status.data_ptr<int32_t>();
  uint8_t* out_ptr = out.data_ptr<uint8_t>();
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      const int64_t* b = box_ptr + 4 * i;
      try {
        decode_jpeg_crop_into(bytes[i].data_ptr<uint8_t>(), bytes[i].numel(), b[0], b[1], b[2], b[3], out_h, out_w, flip_ptr[i], max_pixels,
                              out_ptr + i * image_bytes);
      } catch (...) {  // any failure of one file is that file's status; the message is read again by the wrapper
        status_ptr[i] = 1;
      }
    }
  };
  const int64_t extra = std::min<int64_t>(threads, n) - 1;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(std::max<int64_t>(extra, 0)));
  // A thread that cannot be started (std::system_error: the process is out of threads) must not leave the
  // started ones joinable while the exception unwinds (std::terminate): carry on with those already running,
  // the calling thread included; the atomic counter hands every image to whichever thread is free.
  for (int64_t t = 0; t < extra; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();  // the calling thread is one of the `threads`
  for (auto& t : pool) t.join();
  return status;
}

std::tuple<at::Tensor, at::Tensor> decode_jpeg_crop_batch_cpu(at::TensorList data, const at::Tensor& boxes, const at::Tensor& hflip,
                                                              int64_t out_h, int64_t out_w, int64_t threads,
                                                              std::optional<int64_t> max_pixels) {
  check_batch(data, boxes, hflip, threads);
  TORCH_CHECK(out_h > 0 && out_w > 0 && out_h <= 65535 && out_w <= 65535,
              "decode_jpeg_crop_batch: output size must be positive and at most 65535, got ", out_h, "x", out_w);
  at::Tensor out = at::empty({static_cast<int64_t>(data.size()), 3, out_h, out_w}, at::kByte);
  at::Tensor status = decode_into(data, boxes, hflip, out, threads, max_pixels);
  return {out, status};
}

at::Tensor decode_jpeg_crop_batch_out_cpu(at::TensorList data, const at::Tensor& boxes, const at::Tensor& hflip, at::Tensor& out,
                                          int64_t threads, std::optional<int64_t> max_pixels) {
  check_batch(data, boxes, hflip, threads);
  const int64_t n = static_cast<int64_t>(data.size());
  TORCH_CHECK(out.device().is_cpu() && out.dtype() == at::kByte && out.dim() == 4 && out.size(0) == n && out.size(1) == 3 && out.is_contiguous(),
              "decode_jpeg_crop_batch_out: out must be a contiguous uint8 (N, 3, H, W) CPU tensor with N = ", n, ", got ", out.dtype(), " ",
              out.sizes(), out.is_contiguous() ? "" : " (not contiguous)");
  TORCH_CHECK(out.size(2) > 0 && out.size(3) > 0 && out.size(2) <= 65535 && out.size(3) <= 65535,
              "decode_jpeg_crop_batch_out: output size must be positive and at most 65535, got ", out.size(2), "x", out.size(3));
  return decode_into(data, boxes, hflip, out, threads, max_pixels);
}

}  // namespace

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("decode_jpeg_crop_batch", &decode_jpeg_crop_batch_cpu);
  m.impl("decode_jpeg_crop_batch_out", &decode_jpeg_crop_batch_out_cpu);
}

}  // namespace fastpipe
