// Small, allocation-light formatting for validation and reason messages (no iostreams, no locale).
#pragma once

#include <cstdint>
#include <string>

#include "core/clock.h"

namespace tandem::policy {

std::string format_double(double v);            // shortest round-trip form: 0.15, 1.5, 1e+20
std::string format_duration(Clock::duration d); // "250ms", "3s", "1.5s", "-2ms"
std::string format_bytes(std::uint64_t bytes);  // "512 MiB", "1.50 GiB", "100 B"

}  // namespace tandem::policy
