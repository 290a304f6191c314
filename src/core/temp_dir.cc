#include "core/temp_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace tandem::core {

std::string temp_base() {
  const char* env = std::getenv("TMPDIR");
  struct stat st {};
  if (env != nullptr && env[0] == '/' && ::stat(env, &st) == 0 && S_ISDIR(st.st_mode)) return env;
  return "/tmp";
}

Result<std::string> make_temp_dir(const std::string& prefix) {
  std::string tmpl = temp_base() + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    return fail(Errc::io_error, "cannot create a directory " + tmpl + ": " + std::strerror(errno));
  return tmpl;
}

TempDir::TempDir(const std::string& prefix) {
  auto d = make_temp_dir(prefix);
  if (!d) {
    std::fprintf(stderr, "%s\n", d.error().message.c_str());
    std::abort();
  }
  path_ = std::move(*d);
}

TempDir::~TempDir() {
  std::error_code ec;
  // A test may leave a directory without write permission behind (a journal it made read-only): give it back first.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_directory(ec)) ::chmod(it->path().c_str(), 0700);
  ::chmod(path_.c_str(), 0700);
  std::filesystem::remove_all(path_, ec);
}

const std::string& scratch_root(const std::string& prefix) {
  static const TempDir root("tandem-" + prefix);
  return root.path();
}

}  // namespace tandem::core
