#include "core/text.h"
#include "weights/json_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

namespace tandem::weights::detail {

namespace {


}  // namespace

// SAX pass over an already-validated text: the first key repeated inside the top-level object. Used only when the
// DOM has fewer top-level entries than the text has keys. (nlohmann's callback parser could do this in one pass but
// is ~15x slower than the plain parser.)
struct TopLevelKeys {
  int depth = 0;
  std::size_t count = 0;
  std::set<std::string>* seen = nullptr;  // collect names only when looking for the duplicate
  std::string duplicate;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(Json::number_integer_t) { return true; }
  bool number_unsigned(Json::number_unsigned_t) { return true; }
  bool number_float(Json::number_float_t, const Json::string_t&) { return true; }
  bool string(Json::string_t&) { return true; }
  bool binary(Json::binary_t&) { return true; }
  bool start_object(std::size_t) { return ++depth, true; }
  bool end_object() { return --depth, true; }
  bool start_array(std::size_t) { return ++depth, true; }
  bool end_array() { return --depth, true; }
  bool key(Json::string_t& k) {
    if (depth != 1) return true;
    ++count;
    if (seen != nullptr && duplicate.empty() && !seen->insert(k).second) duplicate = k;
    return true;
  }
  template <class E>
  bool parse_error(std::size_t, const std::string&, const E&) {
    return false;
  }
};

Result<Json> parse_json(std::string_view text, const std::string& origin, std::string* duplicate_top_key) {
  if (tandem::json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return fail(Errc::parse_error, origin + ": JSON nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  try {
    Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
    if (duplicate_top_key != nullptr) {
      duplicate_top_key->clear();
      if (j.is_object()) {
        TopLevelKeys counter;
        Json::sax_parse(text.begin(), text.end(), &counter);
        if (counter.count != j.size()) {
          std::set<std::string> seen;
          TopLevelKeys finder;
          finder.seen = &seen;
          Json::sax_parse(text.begin(), text.end(), &finder);
          *duplicate_top_key = finder.duplicate;
        }
      }
    }
    return j;
  } catch (const Json::exception& e) {
    return fail(Errc::parse_error, origin + ": not valid JSON: " + e.what());
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, origin + ": out of memory while parsing JSON");
  }
}

std::string_view json_kind(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object:
      return "object";
    case Json::value_t::array:
      return "array";
    case Json::value_t::string:
      return "string";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::null:
      return "null";
    default:
      return "invalid";
  }
}

std::optional<std::int64_t> json_int(const Json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<std::int64_t>();
  return std::nullopt;
}

Result<std::string> read_small_file(const std::string& path, std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return fail(Errc::not_found, path + ": file not found");
    return fail(Errc::io_error, path + ": cannot open: " + std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(Errc::io_error, path + ": fstat failed: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(Errc::io_error, path + ": not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    return fail(Errc::format_error, path + ": file is " + std::to_string(st.st_size) + " bytes, more than the " +
                                        std::to_string(max_bytes) + " allowed");
  }
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(Errc::io_error, path + ": read failed: " + std::strerror(errno));
    }
    if (n == 0) break;  // shrank while reading
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  return out;
}

std::string printable(std::string_view name) {
  std::string s = "'";
  std::size_t n = 0;
  for (unsigned char c : name) {
    if (++n > 200) {
      s += "...";
      break;
    }
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    } else {
      s += static_cast<char>(c);
    }
  }
  return s + "'";
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace tandem::weights::detail
