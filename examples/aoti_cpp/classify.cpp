// classify: image files in, the model's answers out, from an AOTInductor package and its model.json.
//
//   classify MODEL.pt2 IMAGE [IMAGE ...] [--top K] [--max_pixels N]
//
// Each image is read and preprocessed as model.json's "preprocessing" says, exactly as the template's Python
// side does it (project/export/preprocessing.py): decoded as RGB, its shorter side resized to the decode
// size (antialiased bilinear), centre-cropped to a square, the central eval_crop of that kept and resized to
// the input size, scaled to [0, 1], mean subtracted and divided by std. Then, for each image, its path and
// one line per answer: the top K classes ("  PROBABILITY  CLASS"), every tag with its threshold, or every
// value. Any error is one line on stderr ("error: ...") and exit status 1.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "image.h"
#include "json.h"

namespace F = torch::nn::functional;

namespace {

// What model.json says about the input and the outputs.
struct Model {
  std::vector<int64_t> input_shape;  // C, H, W
  std::vector<float> mean, std;
  int decode_size = 0;
  double eval_crop = 1.0;
  std::string kind = "class";     // "class", "tags" or "values"
  std::string outputs = "logits";  // "logits", "probabilities" or "values"
  std::vector<std::string> names;
  std::vector<double> thresholds;
};

// model.onnx, model.pt2 -> model.json (the name up to its first dot), as project/export/preprocessing.py finds it.
std::filesystem::path metadata_path(const std::filesystem::path& model) {
  const std::string name = model.filename().string();
  return model.parent_path() / (name.substr(0, name.find('.')) + ".json");
}

Model read_model(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) {
    throw std::runtime_error(path.string() + " does not exist: the package needs the model.json written beside it by "
                             "`python -m project export`");
  }
  std::stringstream text;
  text << file.rdbuf();
  const Json meta = Json::parse(text.str());
  const Json& pre = meta["preprocessing"];
  Model m;
  for (const Json& v : pre["input_shape"].array) m.input_shape.push_back(static_cast<int64_t>(v.num()));
  for (const Json& v : pre["mean"].array) m.mean.push_back(static_cast<float>(v.num()));
  for (const Json& v : pre["std"].array) m.std.push_back(static_cast<float>(v.num()));
  for (const Json& v : pre["class_names"].array) m.names.push_back(v.str());
  m.decode_size = pre.has("source_size") ? static_cast<int>(pre["source_size"].num()) : static_cast<int>(m.input_shape.at(1));
  if (pre.has("eval_crop")) m.eval_crop = pre["eval_crop"].num();
  if (meta.has("task")) {  // absent from exports written before tasks recorded it: one class per image, logits
    const Json& task = meta["task"];
    if (task.has("kind")) m.kind = task["kind"].str();
    if (task.has("outputs")) m.outputs = task["outputs"].str();
    if (task.has("names")) {
      m.names.clear();
      for (const Json& v : task["names"].array) m.names.push_back(v.str());
    }
    if (task.has("thresholds")) {
      for (const Json& v : task["thresholds"].array) m.thresholds.push_back(v.num());
    }
  }
  if (m.kind == "tags" && m.thresholds.empty()) m.thresholds.assign(m.names.size(), 0.5);
  if (m.kind != "class" && m.kind != "tags" && m.kind != "values") {
    throw std::runtime_error(path.string() + ": outputs of kind \"" + m.kind + "\", which this program cannot decode");
  }
  return m;
}

// Python's round(): to the nearest integer, halves to even (the default floating-point rounding mode).
int64_t round_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// (1, C, H, W) -> its central `share` of each side (project/data/augment.py: center_crop).
torch::Tensor center_crop(const torch::Tensor& x, double share) {
  const int64_t h = x.size(2), w = x.size(3);
  const int64_t ch = std::max<int64_t>(1, round_even(h * share)), cw = std::max<int64_t>(1, round_even(w * share));
  return x.slice(2, (h - ch) / 2, (h - ch) / 2 + ch).slice(3, (w - cw) / 2, (w - cw) / 2 + cw);
}

torch::Tensor resize(const torch::Tensor& x, int64_t height, int64_t width) {
  if (x.size(2) == height && x.size(3) == width) return x;
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<int64_t>{height, width})
                               .mode(torch::kBilinear)
                               .align_corners(false)
                               .antialias(true));
}

// An image file -> the network's input (1, C, H, W), float32, as the template's evaluation made it.
torch::Tensor to_input(const std::string& path, const Model& m, long long max_pixels) {
  const int size = m.decode_size;
  RgbImage image = decode_image(path, size, max_pixels);
  torch::Tensor x = torch::from_blob(image.pixels.data(), {1, image.height, image.width, 3}, torch::kUInt8)
                        .permute({0, 3, 1, 2});  // (1, 3, h, w), uint8, a view of the pixels
  // The shorter side to `size`, then the central square (project/data/image_reading.py: decode_image).
  const double scale = static_cast<double>(size) / std::min(image.width, image.height);
  const int64_t nw = std::max<int64_t>(size, round_even(image.width * scale));
  const int64_t nh = std::max<int64_t>(size, round_even(image.height * scale));
  x = resize(x, nh, nw);  // uint8 in, uint8 out, rounded as PIL rounds
  x = x.slice(2, (nh - size) / 2, (nh - size) / 2 + size).slice(3, (nw - size) / 2, (nw - size) / 2 + size);
  // Evaluation's view (project/data/augment.py: evaluation_view): float in [0, 255] once resized.
  if (m.eval_crop < 1) x = center_crop(x, m.eval_crop);
  if (x.size(2) != m.input_shape[1] || x.size(3) != m.input_shape[2]) {
    x = resize(x.to(torch::kFloat), m.input_shape[1], m.input_shape[2]);
  }
  // (x / 255 - mean) / std, computed as the template computes it (project/data/augment.py: normalize).
  const auto mean = torch::tensor(m.mean), std = torch::tensor(m.std);
  const auto scale_by = (1.0 / (255.0 * std)).view({1, -1, 1, 1}), shift = (mean / std).view({1, -1, 1, 1});
  return torch::addcmul(-shift, x.to(torch::kFloat), scale_by).contiguous();
}

void print_answer(const std::string& path, const torch::Tensor& output, const Model& m, int top) {
  std::printf("%s\n", path.c_str());
  torch::Tensor out = output.to(torch::kDouble).flatten();
  if (m.kind == "values") {
    for (int64_t i = 0; i < out.size(0); ++i) std::printf("  %.6g  %s\n", out[i].item<double>(), m.names.at(i).c_str());
    return;
  }
  if (m.outputs == "logits") out = m.kind == "tags" ? out.sigmoid() : out.softmax(0);
  if (m.kind == "tags") {
    for (int64_t i = 0; i < out.size(0); ++i) {
      const double p = out[i].item<double>(), t = m.thresholds.at(i);
      std::printf("  %.6f  %s  (threshold %g: %s)\n", p, m.names.at(i).c_str(), t, p >= t ? "tagged" : "not tagged");
    }
    return;
  }
  const auto [probs, indices] = out.topk(std::min<int64_t>(top, out.size(0)));
  for (int64_t i = 0; i < probs.size(0); ++i) {
    std::printf("  %.6f  %s\n", probs[i].item<double>(), m.names.at(indices[i].item<int64_t>()).c_str());
  }
}

int run(int argc, char** argv) {
  std::vector<std::string> images;
  std::string package;
  int top = 5;
  long long max_pixels = 40'000'000;  // the template's default (project/data/image_reading.py: MAX_IMAGE_PIXELS)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--top" || arg == "--max_pixels") && i + 1 < argc) {
      const long long value = std::atoll(argv[++i]);
      if (value < 1) throw std::runtime_error(arg + " must be at least 1");
      if (arg == "--top") {
        top = static_cast<int>(std::min<long long>(value, 1 << 20));
      } else {
        max_pixels = value;
      }
    } else if (package.empty()) {
      package = arg;
    } else {
      images.push_back(arg);
    }
  }
  if (package.empty() || images.empty()) {
    std::fprintf(stderr, "usage: classify MODEL.pt2 IMAGE [IMAGE ...] [--top K] [--max_pixels N]\n");
    return 2;
  }
  if (!std::filesystem::is_regular_file(package)) throw std::runtime_error("AOTInductor package " + package + " does not exist");
  const Model model = read_model(metadata_path(package));
  torch::NoGradGuard no_grad;
  torch::inductor::AOTIModelPackageLoader loader(package);
  const auto metadata = loader.get_metadata();
  const auto device_key = metadata.find("AOTI_DEVICE_KEY");
  const torch::Device device(device_key == metadata.end() ? "cpu" : device_key->second);
  for (const std::string& path : images) {
    const torch::Tensor x = to_input(path, model, max_pixels).to(device);
    print_answer(path, loader.run({x}).at(0).cpu(), model, top);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::string message = e.what();  // libtorch's errors hold a C++ backtrace after the first line
    std::fprintf(stderr, "error: %s\n", message.substr(0, message.find('\n')).c_str());
    return 1;
  }
}
