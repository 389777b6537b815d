// Labelled image sets for `kiln eval`: an ImageFolder tree or a label file
// ("path class_id" per line, the way ImageNet's validation ground truth is
// shipped), read into one ordered list of (path, class id).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace kiln {

struct EvalItem {
  std::string path;
  int class_id = 0;
};

struct EvalSet {
  std::vector<EvalItem> items;
  size_t classes = 0;  // distinct class ids (folders, or ids in the label file)
};

// ImageFolder (torchvision): one subfolder per class. A folder whose name is
// one of `labels` gets that label's index when every folder is one; otherwise
// class id = position in sorted order. Images (.png/.jpg/.jpeg, any case) are
// taken in sorted order within each folder.
EvalSet read_image_folder(const std::filesystem::path& dir, const std::vector<std::string>& labels);

// Label file: one "path class_id" per line; the path is everything before the
// last run of blanks (so it may contain spaces), relative to `images_dir`, or
// to the label file's folder when `images_dir` is empty; absolute paths are
// kept. Blank lines and lines starting with '#' are skipped. A class id that
// is not an integer in [0, num_classes) (num_classes 0: no upper bound) is an
// input error naming the file and line, e.g. "val.txt:7: class id 'x' ...".
EvalSet read_label_file(const std::filesystem::path& file, const std::filesystem::path& images_dir,
                        int num_classes);
// The same rules on the file's text (`file` names it in errors; relative
// paths are taken against `base`); the fuzzers and read_label_file use it.
EvalSet parse_label_file(const std::string& text, const std::filesystem::path& file, const std::filesystem::path& base,
                         int num_classes);

}  // namespace kiln
