// Finds a model on local disk: either a plain directory or a Hugging Face id
// already downloaded into the HF hub cache. kiln never downloads; the cache
// layout is huggingface_hub's:
//   <hub>/models--<org>--<name>/refs/<ref>            (holds a commit sha)
//   <hub>/models--<org>--<name>/snapshots/<sha>/...   (the files)
// <hub> is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub.
#pragma once
#include <filesystem>
#include <string>

namespace kiln {

struct ResolvedModel {
  std::filesystem::path dir;  // holds config.json
  std::string hf_id;          // "org/name"; empty for a local directory
  std::string revision;       // resolved 40-hex commit; empty for a local directory
};

// model: a local directory (must contain config.json) or a Hugging Face id
// "org/name" (or legacy "name") in the local cache.
// revision: empty -> refs/main; a ref name -> refs/<name>; a 40-hex commit ->
// snapshots/<sha>. A revision with a local directory is a usage error.
// Failures are Error(Input) naming the id and the directory searched.
ResolvedModel resolve_model(const std::string& model, const std::string& revision);

// The hub cache directory from the environment (see above).
std::filesystem::path hf_hub_cache_dir();
// True for a 40-character lower- or upper-case hex string.
bool is_commit_sha(const std::string& s);

}  // namespace kiln
