// Image files to 8-bit RGB pixels, read as the Python side reads them (PIL, project/data/image_reading.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  // row by row, 3 bytes (R, G, B) a pixel
};

// Decodes a PNG or JPEG file (by its content, not its name) to RGB: grayscale is repeated over the channels,
// a palette is expanded, alpha is dropped (not composited), 16-bit samples become 8-bit. A JPEG is decoded at
// the smallest of the scales 1, 1/2, 1/4, 1/8 that keeps both sides at least `draft_size` (what PIL's
// `draft` does). Throws std::runtime_error naming the file for anything else, and for an image of more than
// `max_pixels` pixels (a decompression bomb), before decoding it.
RgbImage decode_image(const std::string& path, int draft_size, long long max_pixels);
