// Where the tools find Tandem's bundled data (data/ in the source tree: the Llama 2 tokenizer).
//
// meson passes three paths: TANDEM_DATA_DIR, the installed copy (<prefix>/<datadir>/tandem, /usr/share/tandem in
// the Debian package); TANDEM_SOURCE_DATA_DIR, the source tree's data/; TANDEM_BUILD_ROOT, meson's build directory.
// A binary running from inside the build directory (tests, scripts/demo.sh) uses the source tree, so nothing has
// to be installed and an installed copy never shadows the tree being tested; an installed binary uses the installed
// copy. If the preferred file is missing, the other one is tried.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>

#ifndef TANDEM_DATA_DIR
#define TANDEM_DATA_DIR "/usr/share/tandem"
#endif

namespace tandem::tools {

inline std::string bundled_data(const std::string& relative) {
  namespace fs = std::filesystem;
  const std::string installed = std::string(TANDEM_DATA_DIR) + "/" + relative;
#if defined(TANDEM_SOURCE_DATA_DIR) && defined(TANDEM_BUILD_ROOT)
  const std::string source = std::string(TANDEM_SOURCE_DATA_DIR) + "/" + relative;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  bool in_build_tree = false;
  if (!ec) {
    const fs::path root = fs::weakly_canonical(TANDEM_BUILD_ROOT, ec);
    if (!ec) {
      const auto [r, e] = std::mismatch(root.begin(), root.end(), exe.begin(), exe.end());
      in_build_tree = r == root.end() || (std::next(r) == root.end() && r->empty());  // "dir/" ends in ""
      (void)e;
    }
  }
  const std::string& first = in_build_tree ? source : installed;
  const std::string& second = in_build_tree ? installed : source;
  if (fs::exists(first, ec)) return first;
  if (fs::exists(second, ec)) return second;
  return first;
#else
  return installed;
#endif
}

}  // namespace tandem::tools
