// A stand-in for tandemd's Embed side (ListModels + Embed only), for tests/client/it_image_search_fake.sh: drives
// tandemctl index/search through the real D-Bus contract before the daemon has embedding models.
//
// Vectors (dim 8): the "image" is a file that starts with a PNG or JPEG signature followed by a word; a text is a
// word. The vector of a word: v[byte % 8] += 1 for each byte, L2-normalised, so a text and an image of the same word
// have cosine 1. A file without a signature is InvalidArgument (the whole call, as tandemd does).
// FAKE_BUSY_FIRST=1: the first Embed call answers Busy with retry_after_ms=100. FAKE_MAX_INPUTS=N: more inputs than
// N is InvalidArgument. It counts calls in the file named by FAKE_CALLS (one line per call: the number of inputs).
#include <sdbus-c++/sdbus-c++.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

constexpr const char* kIface = "io.tandem.Tandem1";
using Dict = std::map<std::string, sdbus::Variant>;

std::vector<double> word_vector(const std::string& w) {
  std::vector<double> v(8, 0.0);
  for (unsigned char c : w) v[c % 8] += 1;
  double n = 0;
  for (double x : v) n += x * x;
  if (n == 0) {
    v[0] = 1;
    n = 1;
  }
  for (double& x : v) x /= std::sqrt(n);
  return v;
}

std::vector<double> image_vector(const std::vector<std::uint8_t>& bytes, std::size_t index) {
  static const std::string png = "\x89PNG\r\n\x1a\n", jpg = "\xff\xd8\xff";
  std::string s(bytes.begin(), bytes.end());
  std::size_t skip = s.rfind(png, 0) == 0 ? png.size() : s.rfind(jpg, 0) == 0 ? jpg.size() : 0;
  if (skip == 0)
    throw sdbus::Error(std::string(kIface) + ".Error.InvalidArgument",
                       "input " + std::to_string(index) + ": not a JPEG or PNG file");
  std::string word = s.substr(skip);
  while (!word.empty() && (word.back() == '\n' || word.back() == ' ')) word.pop_back();
  return word_vector(word);
}

}  // namespace

int main() {
  auto conn = sdbus::createSessionBusConnection(kIface);
  auto obj = sdbus::createObject(*conn, "/io/tandem/Tandem1");
  bool busy_first = std::getenv("FAKE_BUSY_FIRST") && std::string(std::getenv("FAKE_BUSY_FIRST")) == "1";
  std::size_t max_inputs = std::getenv("FAKE_MAX_INPUTS") ? std::strtoul(std::getenv("FAKE_MAX_INPUTS"), nullptr, 10) : 0;
  std::string calls_file = std::getenv("FAKE_CALLS") ? std::getenv("FAKE_CALLS") : "";

  obj->registerMethod("ListModels").onInterface(kIface).implementedAs([] {
    Dict llm = {{"name", sdbus::Variant(std::string("tiny"))}, {"kind", sdbus::Variant(std::string("llm"))},
                {"default", sdbus::Variant(true)}};
    Dict clip = {{"name", sdbus::Variant(std::string("fake-clip"))},
                 {"kind", sdbus::Variant(std::string("embedding"))},
                 {"fingerprint", sdbus::Variant(std::string(std::getenv("FAKE_FINGERPRINT") ? std::getenv("FAKE_FINGERPRINT") : "fp-1"))},
                 {"dim", sdbus::Variant(std::uint32_t{8})},
                 {"image_size", sdbus::Variant(std::uint32_t{224})},
                 {"modalities", sdbus::Variant(std::vector<std::string>{"text", "image"})}};
    return std::vector<Dict>{llm, clip};
  });
  std::uint64_t job = 0;
  obj->registerMethod("Embed")
      .onInterface(kIface)
      .implementedAs([&](const std::string& model, const std::vector<std::string>& texts,
                         const std::vector<sdbus::UnixFd>& fds, const std::vector<std::vector<std::uint8_t>>& images,
                         const Dict&) -> std::tuple<std::vector<std::vector<double>>, Dict> {
        const std::size_t inputs = texts.size() + fds.size() + images.size();
        if (!calls_file.empty()) std::ofstream(calls_file, std::ios::app) << inputs << "\n";
        if (busy_first) {
          busy_first = false;
          throw sdbus::Error(std::string(kIface) + ".Error.Busy", "all slots are taken; retry_after_ms=100");
        }
        if (model != "" && model != "fake-clip")
          throw sdbus::Error(std::string(kIface) + ".Error.UnknownModel", "no model " + model);
        if (inputs == 0) throw sdbus::Error(std::string(kIface) + ".Error.InvalidArgument", "no inputs");
        if (max_inputs && inputs > max_inputs)
          throw sdbus::Error(std::string(kIface) + ".Error.InvalidArgument",
                             "too many inputs (" + std::to_string(inputs) + " > max_inputs " +
                                 std::to_string(max_inputs) + ")");
        std::vector<std::vector<double>> out;
        for (const auto& t : texts) out.push_back(word_vector(t));
        std::size_t i = texts.size();
        for (const auto& fd : fds) {
          std::vector<std::uint8_t> bytes;
          char buf[4096];
          ssize_t n;
          while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) bytes.insert(bytes.end(), buf, buf + n);
          if (n < 0) throw sdbus::Error(std::string(kIface) + ".Error.InvalidArgument", "unreadable fd");
          out.push_back(image_vector(bytes, i++));
        }
        for (const auto& b : images) out.push_back(image_vector(b, i++));
        Dict r = {{"job_id", sdbus::Variant(++job)},
                  {"model", sdbus::Variant(std::string("fake-clip"))},
                  {"route", sdbus::Variant(std::string("cpu"))},
                  {"dim", sdbus::Variant(std::uint32_t{8})},
                  {"inputs", sdbus::Variant(static_cast<std::uint32_t>(inputs))}};
        return {out, r};
      });
  obj->finishRegistration();
  conn->enterEventLoop();
}
