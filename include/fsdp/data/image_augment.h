// fsdp/data/image_augment.h: which augmentations a training batch of images goes through
// (data.augment; datasets.h: random_shift, then random_horizontal_flip).
#pragma once

#include "fsdp/enum_names.h"

namespace fsdp::data {
enum class ImageAugment { None, Hflip, Shift, ShiftHflip };
inline bool shifts(ImageAugment a) { return a == ImageAugment::Shift || a == ImageAugment::ShiftHflip; }
inline bool flips(ImageAugment a) { return a == ImageAugment::Hflip || a == ImageAugment::ShiftHflip; }
}  // namespace fsdp::data

namespace fsdp {
template <>
struct EnumNames<data::ImageAugment> {
  static constexpr std::pair<data::ImageAugment, const char*> values[] = {
      {data::ImageAugment::None, "none"},
      {data::ImageAugment::Hflip, "hflip"},
      {data::ImageAugment::Shift, "shift"},
      {data::ImageAugment::ShiftHflip, "shift+hflip"},
  };
};
}  // namespace fsdp
