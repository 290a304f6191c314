// The journal's record codec: CRC-32C, framing, the JSON payload of each record type and its validation
// (docs/journal.md, "Record format"). JobJournal's file handling, replay and compaction are in journal.cc.
#include "daemon/journal_codec.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "core/text.h"
#include "daemon/journal.h"

namespace tandem::daemon {

namespace {

using Json = nlohmann::json;

constexpr char kMagic[4] = {'T', 'J', 'R', '1'};
// Deepest payload we write: object -> array -> object -> string (a restore record's history). Anything deeper is
// corruption, rejected before nlohmann recurses into it.
constexpr int kMaxDepth = 4;

// --- CRC-32C -----------------------------------------------------------------------------------------------------

// Slicing-by-8: table[0] is the classic byte table, table[k][i] advances table[k-1][i] by one more zero byte.
using CrcTables = std::array<std::array<std::uint32_t, 256>, 8>;
constexpr CrcTables make_crc_tables() {
  CrcTables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  }
  return t;
}
constexpr CrcTables kCrc = make_crc_tables();

std::uint32_t load_u32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return std::uint32_t{u[0]} | std::uint32_t{u[1]} << 8 | std::uint32_t{u[2]} << 16 | std::uint32_t{u[3]} << 24;
}

void store_u32(char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xffu);
}

// --- strings that may not be UTF-8 ---------------------------------------------------------------------------------


constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    std::uint32_t v = std::uint32_t{p[i]} << 16 | std::uint32_t{p[i + 1]} << 8 | p[i + 2];
    for (int k = 3; k >= 0; --k) out += kB64[(v >> (6 * k)) & 63];
  }
  if (std::size_t rest = in.size() - i; rest > 0) {
    std::uint32_t v = std::uint32_t{p[i]} << 16 | (rest == 2 ? std::uint32_t{p[i + 1]} << 8 : 0);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int pad = 0;
    if (last && in[i + 3] == '=') pad = in[i + 2] == '=' ? 2 : 1;
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      int d = k >= 4 - pad ? 0 : val(in[i + k]);
      if (d < 0) return std::nullopt;
      v = v << 6 | static_cast<std::uint32_t>(d);
    }
    out += static_cast<char>((v >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
  }
  return out;
}

// A byte string goes in as "key" when it is UTF-8 (readable with jq), else as "key_b64" (byte-exact either way).
void put_str(Json& j, const std::string& key, const std::string& s) {
  if (tandem::valid_utf8(s)) {
    j[key] = s;
  } else {
    j[key + "_b64"] = base64_encode(s);
  }
}

bool get_str(const Json& j, const std::string& key, std::string& out) {
  auto a = j.find(key);
  auto b = j.find(key + "_b64");
  if ((a == j.end()) == (b == j.end())) return false;  // exactly one of them
  if (a != j.end()) {
    if (!a->is_string()) return false;
    out = a->get<std::string>();
    return true;
  }
  if (!b->is_string()) return false;
  auto d = base64_decode(b->get_ref<const std::string&>());
  if (!d) return false;
  out = std::move(*d);
  return true;
}

bool get_u64(const Json& j, const char* key, std::uint64_t& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  out = it->get<std::uint64_t>();
  return true;
}

bool get_u32(const Json& j, const char* key, std::uint32_t& out) {
  std::uint64_t v = 0;
  if (!get_u64(j, key, v) || v > std::numeric_limits<std::uint32_t>::max()) return false;
  out = static_cast<std::uint32_t>(v);
  return true;
}

bool get_i64(const Json& j, const char* key, std::int64_t& out) {
  auto it = j.find(key);
  if (it == j.end()) return false;
  if (it->is_number_unsigned()) {
    auto v = it->get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
    out = static_cast<std::int64_t>(v);
    return true;
  }
  if (!it->is_number_integer()) return false;
  out = it->get<std::int64_t>();
  return true;
}

bool get_tokens(const Json& j, std::vector<std::int32_t>& out) {
  auto it = j.find("tokens");
  if (it == j.end() || !it->is_array()) return false;
  out.clear();
  out.reserve(it->size());
  for (const auto& v : *it) {
    if (!v.is_number_integer()) return false;
    std::int64_t t = 0;
    if (v.is_number_unsigned()) {
      auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) return false;
      t = static_cast<std::int64_t>(u);
    } else {
      t = v.get<std::int64_t>();
      if (t < std::numeric_limits<std::int32_t>::min() || t > std::numeric_limits<std::int32_t>::max()) return false;
    }
    out.push_back(static_cast<std::int32_t>(t));
  }
  return true;
}


// --- phases -------------------------------------------------------------------------------------------------------

constexpr std::string_view kNonTerminal[] = {"queued", "running", "retrying", "migrating"};
constexpr std::string_view kTerminal[] = {"completed", "failed", "cancelled"};
// "embedded": an embedding job's run (one forward of its inputs) completed; "end_of_audio": a transcription job's
// window loop reached the end of its audio.
constexpr std::string_view kFinishReasons[] = {"eos", "stop_string", "max_tokens", "context_full", "embedded",
                                               "end_of_audio", "stream_closed"};

template <std::size_t N>
bool one_of(std::string_view s, const std::string_view (&set)[N]) {
  return std::find(std::begin(set), std::end(set), s) != std::end(set);
}

}  // namespace

std::uint32_t crc32c(std::string_view data, std::uint32_t crc) noexcept {
  crc = ~crc;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::size_t n = data.size();
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = crc ^ (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
                                    std::uint32_t{p[3]} << 24);
    crc = kCrc[7][lo & 0xffu] ^ kCrc[6][(lo >> 8) & 0xffu] ^ kCrc[5][(lo >> 16) & 0xffu] ^ kCrc[4][lo >> 24] ^
          kCrc[3][p[4]] ^ kCrc[2][p[5]] ^ kCrc[1][p[6]] ^ kCrc[0][p[7]];
  }
  for (; n > 0; --n, ++p) crc = kCrc[0][(crc ^ *p) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

std::string frame_journal_record(std::uint8_t type, std::string_view payload) {
  std::string out(kJournalHeaderBytes, '\0');
  std::memcpy(out.data(), kMagic, 4);
  store_u32(out.data() + 4, static_cast<std::uint32_t>(payload.size()));
  out[12] = static_cast<char>(type);
  std::uint32_t crc = crc32c(payload, crc32c(std::string_view(out.data() + 12, 4)));
  store_u32(out.data() + 8, crc);
  out.append(payload);
  return out;
}

bool is_journal_phase(std::string_view phase) noexcept {
  return one_of(phase, kNonTerminal) || one_of(phase, kTerminal);
}

bool is_terminal_journal_phase(std::string_view phase) noexcept { return one_of(phase, kTerminal); }

bool JournalJob::terminal() const { return is_terminal_journal_phase(phase); }


namespace journal_codec {


FrameState check_frame(std::string_view buf, std::size_t pos, std::uint8_t& type, std::string_view& payload) {
  const std::size_t avail = buf.size() - pos;
  if (avail < 4) return std::memcmp(buf.data() + pos, kMagic, avail) == 0 ? FrameState::short_read : FrameState::bad;
  if (std::memcmp(buf.data() + pos, kMagic, 4) != 0) return FrameState::bad;
  if (avail < kJournalHeaderBytes) return FrameState::short_read;
  const char* h = buf.data() + pos;
  const std::uint32_t len = load_u32(h + 4);
  if (len > kJournalMaxPayload || h[13] != 0 || h[14] != 0 || h[15] != 0) return FrameState::bad;
  if (avail - kJournalHeaderBytes < len) return FrameState::short_read;
  payload = std::string_view(h + kJournalHeaderBytes, len);
  if (crc32c(payload, crc32c(std::string_view(h + 12, 4))) != load_u32(h + 8)) return FrameState::bad;
  type = static_cast<std::uint8_t>(h[12]);
  return FrameState::ok;
}
std::size_t find_next_frame(std::string_view buf, std::size_t from) {
  const std::string_view magic(kMagic, 4);
  while (from < buf.size()) {
    std::size_t at = buf.find(magic, from);
    if (at == std::string_view::npos) return at;
    std::uint8_t type;
    std::string_view payload;
    if (check_frame(buf, at, type, payload) == FrameState::ok) return at;
    from = at + 1;
  }
  return std::string_view::npos;
}

bool known_type(std::uint8_t t) { return t >= 1 && t <= 7; }

Status validate_fields(JournalRecord type, const JournalJob& j) {
  auto bad = [&](const std::string& what) {
    return fail(Errc::invalid_argument, "journal record for job " + std::to_string(j.id) + ": " + what);
  };
  if (type == JournalRecord::meta) return {};
  if (j.id == 0) return bad("job id 0");
  switch (type) {
    case JournalRecord::accepted:
      if (j.model.size() > kJournalMaxName) return bad("model longer than 1024 bytes");
      if (j.idempotency_key.size() > kJournalMaxName) return bad("idempotency_key longer than 1024 bytes");
      return {};
    case JournalRecord::transition:
      if (!one_of(j.phase, kNonTerminal)) {
        return bad("transition phase '" + j.phase.substr(0, 64) + "' is not one of queued|running|retrying|migrating");
      }
      if (j.reason.size() > kJournalMaxReason) return bad("reason longer than 4096 bytes");
      if (j.route_json.size() > kJournalMaxSideJson) return bad("route_json longer than 65536 bytes");
      return {};
    case JournalRecord::outcome:
    case JournalRecord::restore: {
      if (type == JournalRecord::outcome && !one_of(j.phase, kTerminal)) {
        return bad("outcome phase '" + j.phase.substr(0, 64) + "' is not one of completed|failed|cancelled");
      }
      if (type == JournalRecord::restore && !is_journal_phase(j.phase)) {
        return bad("phase '" + j.phase.substr(0, 64) + "' is unknown");
      }
      if (j.reason.size() > kJournalMaxReason) return bad("reason longer than 4096 bytes");
      if (j.route_json.size() > kJournalMaxSideJson) return bad("route_json longer than 65536 bytes");
      if (j.error_code.size() > kJournalMaxErrorCode) return bad("error_code longer than 256 bytes");
      if (j.error_message.size() > kJournalMaxSideJson) return bad("error_message longer than 65536 bytes");
      if (j.retry_after_ms < 0) return bad("retry_after_ms < 0");
      if (j.history_json.size() > kJournalHistoryLimit) return bad("more than 64 history entries");
      if (j.phase == "completed") {
        if (!one_of(j.finish_reason, kFinishReasons)) {
          return bad("completed needs finish_reason eos|stop_string|max_tokens|context_full|embedded|end_of_audio|stream_closed, got '" +
                     j.finish_reason.substr(0, 64) + "'");
        }
      } else if (!j.finish_reason.empty()) {
        return bad("finish_reason is only for completed");
      }
      if (j.phase == "failed" && j.error_code.empty()) return bad("failed needs an error_code");
      return {};
    }
    case JournalRecord::checkpoint:
    case JournalRecord::output:
    case JournalRecord::meta:
      return {};
  }
  return {};
}

Result<std::string> encode(JournalRecord type, const JournalJob& j, std::int64_t at, std::uint64_t max_job_id,
                           std::size_t history_skip) {
  Json o = Json::object();
  try {
    if (type == JournalRecord::meta) {
      o["max_job_id"] = max_job_id;
      return o.dump();
    }
    o["id"] = j.id;
    switch (type) {
      case JournalRecord::accepted:
        put_str(o, "model", j.model);
        put_str(o, "key", j.idempotency_key);
        o["digest"] = j.request_digest;
        o["uid"] = j.owner_uid;
        put_str(o, "request", j.request_json);
        o["at"] = at;
        break;
      case JournalRecord::transition:
        put_str(o, "phase", j.phase);
        put_str(o, "reason", j.reason);
        put_str(o, "route", j.route_json);
        o["at"] = at;
        o["attempts"] = j.attempts;
        break;
      case JournalRecord::checkpoint:
      case JournalRecord::output:
        o["tokens"] = j.tokens;
        put_str(o, "text", j.text);
        break;
      case JournalRecord::outcome:
        put_str(o, "phase", j.phase);
        put_str(o, "reason", j.reason);
        o["tokens"] = j.tokens;
        put_str(o, "text", j.text);
        put_str(o, "error_code", j.error_code);
        put_str(o, "error_message", j.error_message);
        o["retry_after_ms"] = j.retry_after_ms;
        put_str(o, "finish_reason", j.finish_reason);
        o["at"] = at;
        break;
      case JournalRecord::restore: {
        put_str(o, "phase", j.phase);
        put_str(o, "reason", j.reason);
        put_str(o, "route", j.route_json);
        Json h = Json::array();
        for (std::size_t i = history_skip; i < j.history_json.size(); ++i) {
          Json e = Json::object();
          put_str(e, "e", j.history_json[i]);
          h.push_back(std::move(e));
        }
        o["history"] = std::move(h);
        o["attempts"] = j.attempts;
        put_str(o, "error_code", j.error_code);
        put_str(o, "error_message", j.error_message);
        o["retry_after_ms"] = j.retry_after_ms;
        put_str(o, "finish_reason", j.finish_reason);
        o["finished_at"] = j.finished_unix_ms;
        break;
      }
      case JournalRecord::meta:
        break;
    }
    return o.dump();
  } catch (const std::exception& e) {
    return fail(Errc::internal, std::string("journal: cannot encode a record: ") + e.what());
  }
}

std::string outcome_history_entry(const JournalJob& j, std::int64_t at) {
  Json o = Json::object();
  o["id"] = j.id;
  put_str(o, "phase", j.phase);
  put_str(o, "reason", j.reason);
  o["at"] = at;
  try {
    return o.dump();
  } catch (const std::exception&) {
    return "{}";
  }
}

}  // namespace journal_codec

using namespace journal_codec;

bool JobJournal::decode(JournalRecord type, std::string_view payload, Rec& r) {
  if (tandem::json_nesting_depth(payload, kMaxDepth) > kMaxDepth) return false;
  Json o;
  try {
    o = Json::parse(payload, nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception&) {
    return false;
  }
  if (!o.is_object()) return false;
  JournalJob& j = r.job;
  if (type == JournalRecord::meta) {
    if (!get_u64(o, "max_job_id", r.max_job_id)) return false;
    return true;
  }
  if (!get_u64(o, "id", j.id)) return false;
  bool ok = true;
  switch (type) {
    case JournalRecord::accepted:
      ok = get_str(o, "model", j.model) && get_str(o, "key", j.idempotency_key) &&
           get_u64(o, "digest", j.request_digest) && get_u32(o, "uid", j.owner_uid) &&
           get_str(o, "request", j.request_json) && get_i64(o, "at", r.at);
      j.accepted_unix_ms = r.at;
      break;
    case JournalRecord::transition:
      ok = get_str(o, "phase", j.phase) && get_str(o, "reason", j.reason) && get_str(o, "route", j.route_json) &&
           get_i64(o, "at", r.at) && get_u32(o, "attempts", j.attempts);
      break;
    case JournalRecord::checkpoint:
    case JournalRecord::output:
      ok = get_tokens(o, j.tokens) && get_str(o, "text", j.text);
      break;
    case JournalRecord::outcome:
      ok = get_str(o, "phase", j.phase) && get_str(o, "reason", j.reason) && get_tokens(o, j.tokens) &&
           get_str(o, "text", j.text) && get_str(o, "error_code", j.error_code) &&
           get_str(o, "error_message", j.error_message) && get_i64(o, "retry_after_ms", j.retry_after_ms) &&
           get_str(o, "finish_reason", j.finish_reason) && get_i64(o, "at", r.at);
      j.finished_unix_ms = r.at;
      break;
    case JournalRecord::restore: {
      ok = get_str(o, "phase", j.phase) && get_str(o, "reason", j.reason) && get_str(o, "route", j.route_json) &&
           get_u32(o, "attempts", j.attempts) && get_str(o, "error_code", j.error_code) &&
           get_str(o, "error_message", j.error_message) && get_i64(o, "retry_after_ms", j.retry_after_ms) &&
           get_str(o, "finish_reason", j.finish_reason) && get_i64(o, "finished_at", j.finished_unix_ms);
      auto h = o.find("history");
      if (!ok || h == o.end() || !h->is_array() || h->size() > kJournalHistoryLimit) return false;
      for (const auto& e : *h) {
        std::string s;
        if (!e.is_object() || !get_str(e, "e", s)) return false;
        j.history_json.push_back(std::move(s));
      }
      break;
    }
    case JournalRecord::meta:
      break;
  }
  if (!ok || !validate_fields(type, j).ok()) return false;
  return true;
}

}  // namespace tandem::daemon
