// fsdp/data/fashion_mnist.h: Fashion-MNIST (Xiao et al. 2017) from Debian's dataset-fashion-mnist
// package: gzipped IDX files, 60,000 training and 10,000 test images of 28x28 greyscale, 10
// classes, the published split.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace fsdp::data {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// The training set's per-pixel mean and standard deviation (of values scaled to [0, 1]).
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

// Held as stored, one byte a pixel: a quarter of fp32's memory on every rank (Fashion-MNIST's
// 70,000 images are 55 MB, not 220), normalised a batch at a time (normalized_images).
struct ImageSet {
  at::Tensor pixels;  // [n, 1, 28, 28] uint8, as in the IDX file
  at::Tensor labels;  // [n] int64 in [0, 10)
  // Images [rows, 1, 28, 28] fp32 of the given pixels' rows: (pixel / 255 - mean) / std.
  at::Tensor images(int64_t begin, int64_t rows) const;
  int64_t held_bytes() const;  // pixels and labels
};

// pixels [..] uint8 -> fp32 (pixel / 255 - mean) / std, the same float operations in the same order
// whatever the batch: a batch's images do not depend on how the set was cut.
at::Tensor normalized_images(const at::Tensor& pixels);

// split: "train" or "test". Throws std::runtime_error naming the file when it is missing,
// truncated or not an IDX file of the expected shape.
ImageSet load_fashion_mnist(const std::string& dir, const std::string& split);

// One IDX file (gzipped or plain), as uint8 with the shape its header states.
at::Tensor read_idx(const std::string& path);

}  // namespace fsdp::data
