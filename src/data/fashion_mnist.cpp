#include "fsdp/data/fashion_mnist.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <memory>
#include <stdexcept>
#include <vector>

namespace fsdp::data {

namespace {

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};

}  // namespace

at::Tensor read_idx(const std::string& path) {
  // gzopen reads plain files transparently too.
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) {
    throw std::runtime_error("IDX file '" + path +
                             "' cannot be opened (Fashion-MNIST comes from Debian's dataset-fashion-mnist package)");
  }
  auto read_exact = [&](void* out, size_t bytes, const char* what) {
    const int got = gzread(file.get(), out, static_cast<unsigned>(bytes));
    if (got != static_cast<int>(bytes)) {
      throw std::runtime_error("IDX file '" + path + "': truncated while reading " + what);
    }
  };
  unsigned char magic[4];
  read_exact(magic, 4, "the magic number");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08) {
    throw std::runtime_error("IDX file '" + path + "': not an unsigned-byte IDX file (bad magic)");
  }
  const int dims = magic[3];
  if (dims < 1 || dims > 4)
    throw std::runtime_error("IDX file '" + path + "': " + std::to_string(dims) + " dimensions");
  std::vector<int64_t> shape(dims);
  int64_t total = 1;
  for (int d = 0; d < dims; ++d) {
    unsigned char be[4];
    read_exact(be, 4, "the shape");
    shape[d] = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | int64_t{be[3]};
    total *= shape[d];
  }
  at::Tensor data = at::empty(shape, at::kByte);
  // gzread takes at most UINT_MAX bytes per call; Fashion-MNIST's largest file is 47 MB.
  read_exact(data.data_ptr<uint8_t>(), static_cast<size_t>(total), "the data");
  return data;
}

ImageSet load_fashion_mnist(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "test") {
    throw std::invalid_argument("fashion-mnist: split '" + split + "' (expected train or test)");
  }
  const std::string prefix = dir + "/" + (split == "train" ? "train" : "t10k");
  at::Tensor images = read_idx(prefix + "-images-idx3-ubyte.gz");
  at::Tensor labels = read_idx(prefix + "-labels-idx1-ubyte.gz");
  if (images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28) {
    throw std::runtime_error("fashion-mnist: " + prefix + "-images: expected [n, 28, 28], got " +
                             std::to_string(images.dim()) + " dimensions");
  }
  if (labels.dim() != 1 || labels.size(0) != images.size(0)) {
    throw std::runtime_error("fashion-mnist: " + split + " has " + std::to_string(images.size(0)) + " images but " +
                             std::to_string(labels.numel()) + " labels");
  }
  ImageSet set;
  set.pixels = images.unsqueeze(1).contiguous();
  set.labels = labels.to(at::kLong);
  if (set.labels.max().item<int64_t>() >= 10) throw std::runtime_error("fashion-mnist: a label is not in [0, 10)");
  return set;
}

at::Tensor normalized_images(const at::Tensor& pixels) {
  // In place after the one conversion: no fp32 temporaries beside the result.
  return pixels.to(at::kFloat).div_(255.0).sub_(kFashionMnistMean).div_(kFashionMnistStd);
}

at::Tensor ImageSet::images(int64_t begin, int64_t rows) const {
  return normalized_images(pixels.narrow(0, begin, rows));
}

int64_t ImageSet::held_bytes() const { return static_cast<int64_t>(pixels.nbytes() + labels.nbytes()); }

}  // namespace fsdp::data
