// Helpers the ring hub's files share (ring_hub.cc, ring_hub_embed.cc). Not an interface.
#pragma once

#include <cstdint>
#include <vector>

#include "core/result.h"
#include "daemon/values.h"
#include "ring/completion_writer.h"

namespace tandem::daemon::ring_detail {

// Dict → record: scalars and lists (uint32 as uint64; maps and history rows stay on D-Bus).
std::vector<std::uint8_t> to_record(const Dict& d);
// An `error` completion: the D-Bus error name's last part and its number, the message, and the "; key=value" facts
// (retry_after_ms, job, tokens) lifted into fields. job_op: not_found means UnknownJob (else UnknownModel).
ring::Completion error_completion(std::uint64_t user_data, const Error& e, bool job_op, std::uint64_t job_id = 0);

}  // namespace tandem::daemon::ring_detail
