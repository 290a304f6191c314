// Client::embed (io.tandem.Tandem1.Embed): its own file, client.cc is long enough.
#include <cmath>
#include <utility>

#include "client/client_impl.h"

namespace tandem::client {

namespace {

using Vectors = std::vector<std::vector<double>>;
// The call below goes through the untyped proxy (the generated method has no timeout); this keeps it checked against
// the XML: a change of Embed's signature breaks the build here.
static_assert(std::is_same_v<decltype(std::declval<io::tandem::Tandem1_proxy&>().Embed(
                                 std::string{}, std::vector<std::string>{}, std::vector<sdbus::UnixFd>{},
                                 std::vector<std::vector<std::uint8_t>>{}, VariantMap{})),
                             std::tuple<Vectors, VariantMap>>,
              "io.tandem.Tandem1.Embed changed: update Client::embed");

}  // namespace

VariantMap to_dbus(const EmbedOptions& o) {
  VariantMap m;
  if (o.idempotency_key) m["idempotency_key"] = sdbus::Variant(*o.idempotency_key);
  if (o.allow_cpu) m["allow_cpu"] = sdbus::Variant(*o.allow_cpu);
  if (o.deadline_ms) m["deadline_ms"] = sdbus::Variant(static_cast<std::uint64_t>(*o.deadline_ms));
  if (o.truncate) m["truncate"] = sdbus::Variant(*o.truncate);
  return m;
}

Result<EmbedReply> Client::embed(const EmbedRequest& r) {
  const std::size_t inputs = r.texts.size() + r.tokens.size() + r.image_fds.size() + r.images.size();
  if (inputs == 0) return fail(Errc::invalid_argument, "Embed: no inputs");
  for (int fd : r.image_fds)
    if (fd < 0) return fail(Errc::invalid_argument, "Embed: an image fd is negative");
  if (r.call_timeout.count() <= 0) return fail(Errc::invalid_argument, "Embed: the call timeout must be positive");

  VariantMap options = to_dbus(r.options);
  if (!r.tokens.empty()) options["tokens"] = sdbus::Variant(r.tokens);
  Vectors raw;
  VariantMap result;
  auto called = impl_->guarded<void>("Embed", [&] {
    // UnixFd(fd) dups the descriptor: the caller keeps its own.
    std::vector<sdbus::UnixFd> fds;
    fds.reserve(r.image_fds.size());
    for (int fd : r.image_fds) fds.emplace_back(fd);
    const auto usec = static_cast<std::uint64_t>(r.call_timeout.count()) * 1000u;
    impl_->methods->raw()
        .callMethod("Embed")
        .onInterface(kInterface)
        .withTimeout(usec)
        .withArguments(r.model, r.texts, fds, r.images, options)
        .storeResultsTo(raw, result);
  });
  if (!called.ok()) return fail(called.error());

  EmbedReply reply;
  reply.info = embed_info_from_dbus(result);
  auto bad = [](std::string m) { return fail(Errc::internal, "Embed: the reply does not match the request: " + m); };
  if (raw.size() != inputs)
    return bad(std::to_string(raw.size()) + " vectors for " + std::to_string(inputs) + " inputs");
  const std::size_t dim = reply.info.dim ? *reply.info.dim : (raw.empty() ? 0 : raw[0].size());
  if (dim == 0) return bad("vectors of width 0");
  reply.vectors.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i].size() != dim)
      return bad("vector " + std::to_string(i) + " has " + std::to_string(raw[i].size()) + " values, dim is " +
                 std::to_string(dim));
    std::vector<float> v(dim);
    for (std::size_t k = 0; k < dim; ++k) {
      if (!std::isfinite(raw[i][k])) return bad("vector " + std::to_string(i) + " has a non-finite value");
      v[k] = static_cast<float>(raw[i][k]);
    }
    reply.vectors.push_back(std::move(v));
  }
  if (!reply.info.dim) reply.info.dim = static_cast<std::uint32_t>(dim);
  return reply;
}

}  // namespace tandem::client
