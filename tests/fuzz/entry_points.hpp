// The parsing entry points the fuzzers drive (tests/fuzz/fuzz_<target>.cpp)
// and the regression tests replay (tests/unit/test_fuzz_inputs.cpp). Each
// feeds bytes to kiln's real reader for one input format and touches what
// came back; it returns normally for an accepted input and throws
// kiln::Error for a rejected one. Anything else — another exception type, a
// crash, a sanitizer report, a hang or an unbounded allocation — is a bug.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::fuzz {

using EntryPoint = void (*)(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // tests/fuzz/corpus/<name>/, fuzz_<name>
  EntryPoint run;
};

void safetensors(const uint8_t* data, size_t size);        // parse_safetensors: header + tensor table
void safetensors_index(const uint8_t* data, size_t size);  // model.safetensors.index.json
void bundle(const uint8_t* data, size_t size);             // a whole .bundle file, then the engine load
void bundle_sections(const uint8_t* data, size_t size);    // section contents in a well-formed container
void hf_config(const uint8_t* data, size_t size);          // timm config.json
void runtime_json(const uint8_t* data, size_t size);       // runtime.json
void labels_json(const uint8_t* data, size_t size);        // labels.json
void npy(const uint8_t* data, size_t size);                // .npy
void eval_labels(const uint8_t* data, size_t size);        // kiln eval --labels FILE ("path class_id" lines)
void image(const uint8_t* data, size_t size);              // JPEG / PNG decode (the jpeg and png targets)
void tactics_json(const uint8_t* data, size_t size);       // a CUDA bundle's tactics.<gpu>.json (record and plans)

// Every target, in the order tools/fuzz.sh runs them.
const std::vector<Target>& targets();

// bundle_sections' input: the sections below in this order, separated by
// kSectionSeparator; missing trailing parts are left out of the bundle.
inline constexpr const char* kSectionSeparator = "\n#section#\n";
inline constexpr const char* kSectionOrder[] = {"graph.json", "weights.bin", "runtime.json", "labels.json",
                                                "provenance.json"};
// The inverse, for writing seeds.
std::vector<uint8_t> join_sections(const std::vector<std::vector<uint8_t>>& parts);

}  // namespace kiln::fuzz
