// Small helpers the trainers (tandem-train-clip, tandem-train-whisper) share for their progress lines and
// training.json: elapsed seconds, a number in %.6g, and the CPU's model name.
#pragma once

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

namespace tandem::train {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline std::string fmt(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// /proc/cpuinfo's first "model name" ("unknown" when there is none).
inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      if (p == std::string::npos) break;
      const auto b = line.find_first_not_of(" \t", p + 1);
      return b == std::string::npos ? "unknown" : line.substr(b);
    }
  return "unknown";
}

}  // namespace tandem::train
