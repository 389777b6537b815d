#include "checkpoint/hf_cache.hpp"

#include <cctype>
#include <cstdlib>
#include <fstream>

#include "core/error.hpp"

namespace kiln {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// huggingface_hub expands "~" in these variables, so users write them that way.
fs::path expand_user(const std::string& p) {
  if (p == "~" || p.rfind("~/", 0) == 0) {
    const std::string home = env("HOME");
    if (!home.empty()) return fs::path(home) / p.substr(p.size() > 1 ? 2 : 1);
  }
  return p;
}

// Hugging Face's own rule for repo names: alphanumerics and - _ . ; no "--"
// or ".."; may not start or end with - or . ; at most 96 characters. Holding
// to it also guarantees the id cannot walk out of the cache directory.
bool is_repo_part(const std::string& s) {
  if (s.empty() || s.size() > 96) return false;
  for (char ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') return false;
  auto edge = [](char ch) { return ch == '-' || ch == '.'; };
  if (edge(s.front()) || edge(s.back())) return false;
  return s.find("--") == std::string::npos && s.find("..") == std::string::npos;
}

bool is_hf_id(const std::string& id) {
  const size_t slash = id.find('/');
  if (slash == std::string::npos) return is_repo_part(id);  // legacy ids such as "gpt2"
  return is_repo_part(id.substr(0, slash)) && is_repo_part(id.substr(slash + 1));
}

// Ref names may contain '/' ("refs/pr/1") but must stay inside refs/.
bool is_safe_ref(const std::string& ref) {
  if (ref.empty() || ref.front() == '/' || ref.back() == '/') return false;
  size_t start = 0;
  while (start <= ref.size()) {
    size_t end = ref.find('/', start);
    if (end == std::string::npos) end = ref.size();
    const std::string part = ref.substr(start, end - start);
    if (part.empty() || part == "." || part == ".." || part.find('\0') != std::string::npos ||
        part.find('\\') != std::string::npos)
      return false;
    start = end + 1;
  }
  return true;
}

std::string read_ref(const std::string& id, const fs::path& ref_file) {
  std::ifstream in(ref_file, std::ios::binary);
  if (!in) fail_input("model '", id, "': cannot read ", ref_file.string());
  // A ref file holds one sha; read a little more than that to notice junk.
  std::string text(128, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (!is_commit_sha(text))
    fail_input("model '", id, "': ", ref_file.string(), " does not hold a 40-hex commit sha");
  return text;
}

}  // namespace

bool is_commit_sha(const std::string& s) {
  if (s.size() != 40) return false;
  for (char ch : s)
    if (!std::isxdigit(static_cast<unsigned char>(ch))) return false;
  return true;
}

fs::path hf_hub_cache_dir() {
  if (auto v = env("HF_HUB_CACHE"); !v.empty()) return expand_user(v);
  if (auto v = env("HF_HOME"); !v.empty()) return expand_user(v) / "hub";
  if (auto v = env("XDG_CACHE_HOME"); !v.empty()) return fs::path(v) / "huggingface" / "hub";
  if (auto v = env("HOME"); !v.empty()) return fs::path(v) / ".cache" / "huggingface" / "hub";
  fail_input("cannot locate the Hugging Face cache: none of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME is set");
}

ResolvedModel resolve_model(const std::string& model, const std::string& revision) {
  std::error_code ec;
  if (model.empty()) fail_usage("no model given");
  if (fs::is_directory(model, ec)) {
    if (!revision.empty())
      fail_usage("revision '", revision, "' given for local directory ", model,
                 "; revisions apply only to Hugging Face ids");
    if (!fs::is_regular_file(fs::path(model) / "config.json", ec))
      fail_input(model, ": model directory has no config.json");
    return {fs::absolute(model), "", ""};
  }
  if (!is_hf_id(model))
    fail_input("model '", model, "': no such directory, and not a Hugging Face id (org/name)");

  const fs::path hub = hf_hub_cache_dir();
  std::string folder = "models--" + model;
  if (size_t slash = folder.find('/'); slash != std::string::npos) folder.replace(slash, 1, "--");
  const fs::path repo = hub / folder;
  if (!fs::is_directory(repo, ec))
    fail_input("model '", model, "' is not a local directory and is not in the Hugging Face cache (looked in ",
               repo.string(), "); download it first, e.g. `hf download ", model, "`");

  std::string sha;
  if (is_commit_sha(revision)) {
    sha = revision;
    for (char& ch : sha) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  } else {
    const std::string ref = revision.empty() ? "main" : revision;
    if (!is_safe_ref(ref)) fail_input("model '", model, "': invalid revision '", ref, "'");
    const fs::path ref_file = repo / "refs" / ref;
    if (!fs::is_regular_file(ref_file, ec))
      fail_input("model '", model, "': revision '", ref, "' is not in the cache (no ", ref_file.string(), ")");
    sha = read_ref(model, ref_file);
  }

  const fs::path snap = repo / "snapshots" / sha;
  if (!fs::is_directory(snap, ec))
    fail_input("model '", model, "': snapshot ", sha, " is not in the cache (no directory ", snap.string(), ")");
  if (!fs::is_regular_file(snap / "config.json", ec))
    fail_input("model '", model, "': ", snap.string(), " has no config.json");
  return {snap, model, sha};
}

}  // namespace kiln
