#include "core/result.h"

namespace tandem {

std::string_view errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::invalid_argument: return "InvalidArgument";
    case Errc::parse_error: return "ParseError";
    case Errc::format_error: return "FormatError";
    case Errc::unsupported: return "Unsupported";
    case Errc::not_found: return "NotFound";
    case Errc::io_error: return "IoError";
    case Errc::out_of_memory: return "OutOfMemory";
    case Errc::kv_exhausted: return "KvExhausted";
    case Errc::device_lost: return "DeviceLost";
    case Errc::cancelled: return "Cancelled";
    case Errc::queue_full: return "QueueFull";
    case Errc::host_memory: return "HostMemory";
    case Errc::incompatible: return "Incompatible";
    case Errc::illegal_transition: return "IllegalTransition";
    case Errc::duplicate: return "Duplicate";
    case Errc::rejected: return "Rejected";
    case Errc::timeout: return "Timeout";
    case Errc::permission_denied: return "NotAuthorized";
    case Errc::unavailable: return "Unavailable";
    case Errc::resumable: return "Resumable";
    case Errc::internal: return "Internal";
  }
  return "Internal";
}

}  // namespace tandem
