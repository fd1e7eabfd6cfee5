#include "image.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include <jpeglib.h>
#include <png.h>

namespace {

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("cannot read image " + path + ": " + why);
}

void check_size(const std::string& path, long long width, long long height, long long max_pixels) {
  if (width * height > max_pixels) {
    fail(path, "it has " + std::to_string(width) + "x" + std::to_string(height) + " pixels, more than the limit of " +
                   std::to_string(max_pixels) + " (--max_pixels)");
  }
}

RgbImage read_png(const std::string& path, std::FILE* file, long long max_pixels) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    fail(path, "out of memory");
  }
  RgbImage image;
  std::vector<png_bytep> rows;  // before setjmp: a longjmp back here must skip no destructor
  if (setjmp(png_jmpbuf(png))) {  // libpng's errors (a corrupt or truncated file) land here
    png_destroy_read_struct(&png, &info, nullptr);
    fail(path, "not a readable PNG (corrupt or truncated)");
  }
  png_init_io(png, file);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  check_size(path, width, height, max_pixels);
  const int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) {
    // PIL reads 16-bit grayscale as integers, which the template scales by 1/257 (rounded); 16-bit colour
    // it reads by the high byte.
    if (color == PNG_COLOR_TYPE_GRAY) {
      png_set_scale_16(png);
    } else {
      png_set_strip_16(png);
    }
  }
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  if (color & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);  // tRNS is ignored: no alpha channel is added
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != 3 * width) {
    png_destroy_read_struct(&png, &info, nullptr);
    fail(path, "an unsupported PNG pixel format");
  }
  image.width = static_cast<int>(width);
  image.height = static_cast<int>(height);
  image.pixels.resize(static_cast<size_t>(width) * height * 3);
  rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = image.pixels.data() + static_cast<size_t>(y) * width * 3;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return image;
}

struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_jpeg_error(j_common_ptr cinfo) {
  auto* error = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, error->message);
  std::longjmp(error->jump, 1);
}

RgbImage read_jpeg(const std::string& path, std::FILE* file, int draft_size, long long max_pixels) {
  jpeg_decompress_struct cinfo;
  JpegError error;
  cinfo.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = on_jpeg_error;
  error.manager.output_message = [](j_common_ptr) {};  // warnings (e.g. extra bytes) are not errors
  RgbImage image;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&cinfo);
    fail(path, std::string("not a readable JPEG (") + error.message + ")");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, file);
  jpeg_read_header(&cinfo, TRUE);
  check_size(path, cinfo.image_width, cinfo.image_height, max_pixels);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    fail(path, "a CMYK JPEG (convert it to RGB first)");
  }
  // PIL's draft: the largest of 8, 4, 2, 1 that is at most min(width / size, height / size).
  const unsigned scale = draft_size > 0 ? std::min(cinfo.image_width / draft_size, cinfo.image_height / draft_size) : 1;
  cinfo.scale_num = 1;
  cinfo.scale_denom = scale >= 8 ? 8 : scale >= 4 ? 4 : scale >= 2 ? 2 : 1;
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  image.width = static_cast<int>(cinfo.output_width);
  image.height = static_cast<int>(cinfo.output_height);
  image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = image.pixels.data() + static_cast<size_t>(cinfo.output_scanline) * image.width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return image;
}

}  // namespace

RgbImage decode_image(const std::string& path, int draft_size, long long max_pixels) {
  File file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!file) fail(path, "it cannot be opened");
  unsigned char magic[8] = {0};
  const size_t got = std::fread(magic, 1, sizeof magic, file.get());
  std::rewind(file.get());
  if (got == 8 && png_sig_cmp(magic, 0, 8) == 0) return read_png(path, file.get(), max_pixels);
  if (got >= 3 && magic[0] == 0xFF && magic[1] == 0xD8 && magic[2] == 0xFF) {
    return read_jpeg(path, file.get(), draft_size, max_pixels);
  }
  fail(path, "not a PNG or JPEG file");
}
