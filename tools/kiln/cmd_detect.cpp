// kiln detect BUNDLE --image PATH...: each image's detections (boxes in the
// image's pixels, sorted by score), or its error; an unreadable image does
// not stop the others (exit code 2 at the end, with a count). --draw DIR
// writes DIR/<image stem>.png with the boxes and labels drawn (atomically: a
// failed write leaves no file).
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <set>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/error.hpp"
#include "image/image.hpp"
#include "kiln/kiln.hpp"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

// Ten well-separated colours, by class id.
constexpr Rgb kPalette[] = {{230, 25, 75},  {60, 180, 75},  {255, 225, 25}, {0, 130, 200}, {245, 130, 48},
                            {145, 30, 180}, {70, 240, 240}, {240, 50, 230}, {210, 245, 60}, {250, 190, 212}};

int to_px(float v) {
  if (!std::isfinite(v)) return v > 0 ? (1 << 30) : -(1 << 30);
  return static_cast<int>(std::lrint(std::clamp(v, -1e9f, 1e9f)));
}

void draw_detections(ImageU8& img, const Detections& d) {
  const int side = std::min(img.width, img.height);
  const int thick = std::max(1, side / 300), scale = std::max(1, side / 400);
  // Lowest score first, so the best boxes end up on top.
  for (auto it = d.boxes.rbegin(); it != d.boxes.rend(); ++it) {
    const Rgb c = kPalette[static_cast<size_t>(it->class_id) % std::size(kPalette)];
    const int x0 = to_px(it->x_min), y0 = to_px(it->y_min), x1 = to_px(it->x_max), y1 = to_px(it->y_max);
    draw_rect(img, x0, y0, x1, y1, c, thick);
    std::ostringstream text;
    text << it->label << " " << std::fixed << std::setprecision(2) << it->score;
    const int tw = text_width(text.str(), scale) + 2 * scale, th = text_height(scale) + 2 * scale;
    // Label box above the top-left corner, or just inside when at the top edge.
    const int lx = std::clamp(x0, 0, std::max(0, img.width - tw));
    const int ly = y0 - th >= 0 ? y0 - th : std::clamp(y0, 0, std::max(0, img.height - th));
    fill_rect(img, lx, ly, lx + tw - 1, ly + th - 1, c);
    const bool dark = 299 * c.r + 587 * c.g + 114 * c.b > 128000;
    draw_text(img, lx + scale, ly + scale, text.str(), dark ? Rgb{0, 0, 0} : Rgb{255, 255, 255}, scale);
  }
}

}  // namespace

void add_detect(CLI::App& app) {
  struct Opts {
    std::string backend, bundle, draw;
    std::vector<std::string> images;
    float threshold = 0.3f;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("detect", "Detect objects in images with a detection bundle");
  sub->add_option("bundle", o->bundle, "Bundle file")->required();
  add_load_backend_option(sub, o->backend);
  sub->add_option("--image", o->images, "Image file(s) (JPEG or PNG)")->required();
  sub->add_option("--score-threshold", o->threshold, "Keep detections scoring above this (strictly)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_flag("--json", o->json, "JSON output: one object per image ('error' instead of 'detections' when it failed)");
  sub->add_option("--draw", o->draw, "Write each image with its boxes and labels as DIR/<name>.png");
  sub->callback([o] {
    Detector det(Engine::load(o->bundle, LoadOptions{o->backend, &std::cerr}));
    if (!o->draw.empty()) {
      std::error_code ec;
      fs::create_directories(o->draw, ec);
      if (ec || !fs::is_directory(o->draw)) fail_input(o->draw, ": cannot create the --draw directory");
    }
    nlohmann::json all = nlohmann::json::array();
    std::set<std::string> drawn;
    size_t failed = 0;
    for (const auto& path : o->images) {
      // One image per engine call, printed as soon as it is done; the image
      // is decoded once, for the engine and for drawing.
      Detections r;
      ImageU8 img;
      try {
        img = decode_image(path);
        r = det.detect(img.width, img.height, img.rgb.data(), o->threshold);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::Input) throw;
        ++failed;
        if (o->json) all.push_back({{"image", path}, {"error", e.what()}});
        else std::cerr << "kiln: error: " << e.what() << "\n";
        continue;
      }
      std::string out_png;
      if (!o->draw.empty()) {
        // a.jpg and a.png (or two a.jpg in different folders) get a.png, a_1.png.
        const std::string stem = fs::path(path).stem().string();
        std::string name = stem + ".png";
        for (int k = 1; drawn.count(name); ++k) name = stem + "_" + std::to_string(k) + ".png";
        drawn.insert(name);
        out_png = (fs::path(o->draw) / name).string();
        draw_detections(img, r);
        write_png(out_png, img);
      }
      if (o->json) {
        nlohmann::json boxes = nlohmann::json::array();
        for (const auto& d : r.boxes)
          boxes.push_back({{"class_id", d.class_id},
                           {"label", d.label},
                           {"score", d.score},
                           {"box", {d.x_min, d.y_min, d.x_max, d.y_max}}});
        nlohmann::json one = {{"image", path}, {"width", r.image_width}, {"height", r.image_height}, {"detections", boxes}};
        if (!out_png.empty()) one["drawn"] = out_png;
        all.push_back(one);
      } else {
        std::cout << path << " (" << r.image_width << "x" << r.image_height << "): " << r.boxes.size()
                  << (r.boxes.size() == 1 ? " detection" : " detections") << " above " << o->threshold << "\n";
        if (!r.boxes.empty())
          std::cout << "  " << std::setw(6) << "class" << "  " << std::setw(6) << "score" << "  " << std::setw(9) << "x_min"
                    << std::setw(9) << "y_min" << std::setw(9) << "x_max" << std::setw(9) << "y_max" << "  label\n";
        for (const auto& d : r.boxes)
          std::cout << "  " << std::setw(6) << d.class_id << "  " << std::fixed << std::setprecision(4) << d.score << "  "
                    << std::setprecision(1) << std::setw(9) << d.x_min << std::setw(9) << d.y_min << std::setw(9)
                    << d.x_max << std::setw(9) << d.y_max << "  " << d.label << "\n"
                    << std::defaultfloat;
        if (!out_png.empty()) std::cout << "  drawn: " << out_png << "\n";
      }
    }
    if (o->json) std::cout << all.dump(2) << "\n";
    std::cout << std::flush;
    if (failed) fail_input(failed, " of ", o->images.size(), " images could not be read");
  });
}

}  // namespace kiln::cli
