// IdxDataset: images and labels in MNIST's IDX format (raw or gzip), validated.
//
// An IDX image file is a big-endian header (magic 0x00000803, count, rows, cols) followed by
// count*rows*cols bytes; a label file is (magic 0x00000801, count) followed by count bytes.
// loadIdxDataset checks the magic numbers, that both files hold the same number of items, that
// the sizes match the headers exactly (no missing and no trailing bytes) and that every label
// is a digit class (0-9); any failure is an error naming the file and what is wrong.
// Thread safety: pure functions returning values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::mnist {

struct IdxDataset {
  int count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, image after image, row-major
  std::vector<uint8_t> labels;  // count, each 0..9
  std::string source;           // the image file, for messages

  int imageSize() const { return rows * cols; }
};

// Loads an image file and its label file (each raw or .gz, told apart by content).
Result<IdxDataset> loadIdxDataset(const std::string& images_path, const std::string& labels_path);

// Loads split "train" or "t10k" from `dir`: <split>-images-idx3-ubyte[.gz] and
// <split>-labels-idx1-ubyte[.gz] (MNIST's and Fashion-MNIST's file names).
Result<IdxDataset> loadMnistSplit(const std::string& dir, const std::string& split);

}  // namespace cpprun::mnist
