#include "tasks/eval_set.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>
#include <set>

#include "core/error.hpp"

namespace kiln {

namespace fs = std::filesystem;

namespace {

bool is_image(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e == ".png" || e == ".jpg" || e == ".jpeg";
}

}  // namespace

EvalSet read_image_folder(const fs::path& dir, const std::vector<std::string>& labels) {
  if (!fs::is_directory(dir)) fail_input(dir.string(), ": not a directory");
  std::vector<std::string> classes;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) classes.push_back(e.path().filename().string());
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) fail_input(dir.string(), ": no class subfolders (expected DIR/<class>/<image>)");
  std::vector<int> class_id(classes.size());
  bool by_label = !labels.empty();
  for (size_t c = 0; c < classes.size() && by_label; ++c) {
    auto it = std::find(labels.begin(), labels.end(), classes[c]);
    by_label = it != labels.end();
    if (by_label) class_id[c] = static_cast<int>(it - labels.begin());
  }
  for (size_t c = 0; c < classes.size() && !by_label; ++c) class_id[c] = static_cast<int>(c);
  EvalSet set;
  set.classes = classes.size();
  for (size_t c = 0; c < classes.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir / classes[c]))
      if (e.is_regular_file() && is_image(e.path())) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) set.items.push_back({f, class_id[c]});
  }
  if (set.items.empty()) fail_input(dir.string(), ": no .png/.jpg images found");
  return set;
}

EvalSet read_label_file(const fs::path& file, const fs::path& images_dir, int num_classes) {
  std::ifstream in(file);
  if (!in) fail_input(file.string(), ": cannot open label file");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (in.bad()) fail_input(file.string(), ": read error");
  return parse_label_file(text, file, images_dir.empty() ? file.parent_path() : images_dir, num_classes);
}

EvalSet parse_label_file(const std::string& text, const fs::path& file, const fs::path& base, int num_classes) {
  std::istringstream in(text);
  EvalSet set;
  std::set<int> ids;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // files written on Windows
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const size_t last = line.find_last_not_of(" \t");
    const size_t blank = line.find_last_of(" \t", last);
    const std::string where = cat(file.string(), ":", number, ": ");
    if (blank == std::string::npos || blank < first)
      fail_input(where, "expected 'path class_id', got '", line.substr(first, last + 1 - first), "'");
    const std::string id_text = line.substr(blank + 1, last - blank);
    const size_t path_end = line.find_last_not_of(" \t", blank);
    const std::string path = line.substr(first, path_end + 1 - first);
    int id = -1;
    const auto [end, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
    if (ec != std::errc() || end != id_text.data() + id_text.size() || id < 0)
      fail_input(where, "class id '", id_text, "' is not a non-negative integer");
    if (num_classes > 0 && id >= num_classes)
      fail_input(where, "class id ", id, " is out of range: the model has ", num_classes, " classes");
    const fs::path p(path);
    set.items.push_back({(p.is_absolute() ? p : base / p).string(), id});
    ids.insert(id);
  }
  if (set.items.empty()) fail_input(file.string(), ": no 'path class_id' lines");
  set.classes = ids.size();
  return set;
}

}  // namespace kiln
