// Stop strings matched on the generated text across token boundaries. Text that could still turn into a stop
// string is held back, so a stop string is never emitted — not even its first half.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::gen {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Out {
    std::string emit;     // text safe to show now
    bool stopped = false; // a stop string matched; nothing after it (nor it) is emitted
  };

  // Feed newly decoded text. After a stop, further pushes emit nothing.
  Out push(std::string_view text);
  // End of generation without a stop: release the held-back tail.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // which stop string ended the text

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace tandem::gen
