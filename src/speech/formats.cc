// Subtitle and text output of finished segments, and openai/whisper's compression ratio.
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "speech/transcriber.h"

namespace tandem::speech {
namespace {

std::string trimmed(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return std::string(s);
}

// HH:MM:SS<sep>mmm, rounded to the millisecond; negative times clamp to 0.
std::string clock(double seconds, char sep) {
  const long long ms = seconds > 0 ? std::llround(seconds * 1000.0) : 0;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld%c%03lld", ms / 3'600'000, (ms / 60'000) % 60,
                (ms / 1000) % 60, sep, ms % 1000);
  return buf;
}

// A cue's text: trimmed, and "-->" (which would end the cue's timing line) written as "->", as openai does.
std::string cue_text(std::string_view text) {
  std::string t = trimmed(text);
  for (std::size_t p = t.find("-->"); p != std::string::npos; p = t.find("-->", p)) t.replace(p, 3, "->");
  return t;
}

}  // namespace

std::string to_srt(std::span<const Segment> segments) {
  std::string out;
  std::size_t n = 0;
  for (const Segment& s : segments) {
    out += std::to_string(++n) + "\n" + clock(s.start, ',') + " --> " + clock(s.end, ',') + "\n" +
           cue_text(s.text) + "\n\n";
  }
  return out;
}

std::string to_vtt(std::span<const Segment> segments) {
  std::string out = "WEBVTT\n\n";
  for (const Segment& s : segments) {
    out += clock(s.start, '.') + " --> " + clock(s.end, '.') + "\n" + cue_text(s.text) + "\n\n";
  }
  return out;
}

std::string to_text(std::span<const Segment> segments) {
  std::string out;
  for (const Segment& s : segments) out += s.text;
  return trimmed(out);
}

double compression_ratio(std::string_view text) {
  if (text.empty()) return 0.0;
  uLongf size = compressBound(static_cast<uLong>(text.size()));
  std::vector<Bytef> buf(size);
  if (compress2(buf.data(), &size, reinterpret_cast<const Bytef*>(text.data()), static_cast<uLong>(text.size()),
                Z_DEFAULT_COMPRESSION) != Z_OK ||
      size == 0) {
    return 0.0;  // only on allocation failure inside zlib: no fallback is triggered by an unknown ratio
  }
  return static_cast<double>(text.size()) / static_cast<double>(size);
}

}  // namespace tandem::speech
