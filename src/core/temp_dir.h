// Temporary directories that do not outlive their owner: TempDir (a fresh directory under $TMPDIR or /tmp, removed
// with everything in it when the object goes) and scratch_root() (one per process, removed at exit). Every test
// fixture and tool that needs scratch space uses these, so that a run leaves nothing behind under /tmp.
#pragma once

#include <string>

#include "core/result.h"

namespace tandem::core {

// The directory temporary files go to: $TMPDIR when it names a directory, else /tmp.
std::string temp_base();

// A fresh directory `<temp_base()>/<prefix>-XXXXXX` (mkdtemp: mode 0700, a name no one else has).
Result<std::string> make_temp_dir(const std::string& prefix);

class TempDir {
 public:
  // Aborts when the directory cannot be made: a fixture without its scratch space cannot run.
  explicit TempDir(const std::string& prefix = "tandem");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// One directory per process (`tandem-<prefix>-XXXXXX`, made on first use, the prefix of the first call), removed with
// its contents when the process exits normally. For files made once and shared by a whole test binary.
const std::string& scratch_root(const std::string& prefix = "scratch");

}  // namespace tandem::core
