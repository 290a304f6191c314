// A small neutral value model for what the service hands to its front ends (D-Bus today, the ring sessions and
// tandem-validate's logs later): a dictionary of typed values whose alternatives map 1:1 to D-Bus signatures
// (b u t x d s ai as a{st} a{sx} a{su} a(ss) a(sssx)). The service stays free of sdbus-c++ types.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

namespace tandem::daemon {

using HistoryRow = std::tuple<std::string, std::string, std::string, std::int64_t>;  // from, to, reason, at_unix_ms

using Value = std::variant<bool,                                              // b
                           std::uint32_t,                                     // u
                           std::uint64_t,                                     // t
                           std::int64_t,                                      // x
                           double,                                            // d
                           std::string,                                       // s
                           std::vector<std::int32_t>,                         // ai
                           std::vector<std::string>,                          // as
                           std::map<std::string, std::uint64_t>,              // a{st}
                           std::map<std::string, std::int64_t>,               // a{sx}
                           std::map<std::string, std::uint32_t>,              // a{su}
                           std::vector<std::pair<std::string, std::string>>,  // a(ss)
                           std::vector<HistoryRow>>;                          // a(sssx)

using Dict = std::map<std::string, Value>;

}  // namespace tandem::daemon
