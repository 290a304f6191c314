// The ring's embed operation (docs/rings.md "Embed record", ABI 1.1): an `embed` command becomes a Service::embed
// call as the session's owner; its one answer — an `embedded` completion with the vectors, or an `error` — is posted
// when the job ends, if the session is still open then (a session that ended meanwhile drops it; the job's outcome
// stays readable with GetJob). A reply larger than the session's response area allows is an `error` that says so.
#include <cmath>
#include <memory>
#include <utility>

#include "daemon/embed_record.h"
#include "daemon/ring_hub.h"
#include "daemon/ring_hub_internal.h"
#include "ring/record.h"

namespace tandem::daemon {

using ring::Kind;
using ring_detail::error_completion;
using ring_detail::to_record;

namespace {

std::uint64_t dict_u64(const Dict& d, const char* key) {
  const auto it = d.find(key);
  if (it == d.end()) return 0;
  if (const auto* u = std::get_if<std::uint64_t>(&it->second)) return *u;
  if (const auto* u32 = std::get_if<std::uint32_t>(&it->second)) return *u32;
  return 0;
}

}  // namespace

void RingHub::handle_embed(std::uint64_t session_id, const Caller& caller, ring::Command&& cmd) {
  const std::uint64_t ud = cmd.user_data;
  auto parsed = embed_from_record(cmd.record);
  if (!parsed) {
    post_to(session_id, error_completion(ud, parsed.error(), false));
    return;
  }
  EmbedRequest req;
  req.model = std::move(parsed->model);
  req.texts = std::move(parsed->texts);
  for (const auto& t : parsed->tokens) req.tokens.emplace_back(t.begin(), t.end());
  req.images.reserve(parsed->images.size());
  for (auto& img : parsed->images)
    req.images.push_back(std::make_shared<const std::vector<std::uint8_t>>(std::move(img)));
  req.options.idempotency_key = std::move(parsed->idempotency_key);
  req.options.allow_cpu = parsed->allow_cpu;
  req.options.deadline_ms = parsed->deadline_ms;
  req.options.truncate = parsed->truncate;
  // The answer is the one `embedded` completion: job updates the service might send for the embed job go to a
  // destination no session has ("ring:<id>/embed"), so they are dropped instead of arriving without a submit.
  Caller c = caller;
  c.reply_to += "/embed";
  service_->embed(c, std::move(req), [this, session_id, ud](Result<EmbedReply> r) {
    const std::uint64_t limit = max_completion_bytes(session_id);
    if (limit == 0) return;  // the session ended; GetJob has the job
    if (!r) {
      post_to(session_id, error_completion(ud, r.error(), false));
      return;
    }
    EmbedReply& reply = *r;
    const std::uint64_t job = dict_u64(reply.result, "job_id");
    const std::uint64_t count = reply.vectors.size();
    const std::uint64_t dim = count == 0 ? dict_u64(reply.result, "dim") : reply.vectors[0].size();
    for (const auto& v : reply.vectors) {
      bool finite = v.size() == dim;
      for (float x : v) finite = finite && std::isfinite(x);
      if (!finite) {
        post_to(session_id, error_completion(ud, Error{Errc::internal, "the embedding job returned vectors of "
                                                                       "unequal width or non-finite values; job=" +
                                                                           std::to_string(job)},
                                             false, job));
        return;
      }
    }
    Dict d = std::move(reply.result);
    d.erase("vectors");
    d["count"] = count;
    d["dim"] = dim;
    ring::RecordWriter w;
    auto head = to_record(d);
    const std::uint64_t bytes = head.size() + ring::kFieldHeaderSize + 7 + count * dim * 4;
    if (bytes > limit) {
      post_to(session_id,
              error_completion(ud,
                               Error{Errc::invalid_argument,
                                     "the embedding reply (" + std::to_string(count) + " vectors of dim " +
                                         std::to_string(dim) + ", " + std::to_string(bytes) +
                                         " bytes) does not fit this ring session's response area (at most " +
                                         std::to_string(limit) +
                                         " bytes per completion): open the session with a larger "
                                         "response_data_bytes or embed fewer inputs per call; job=" +
                                         std::to_string(job)},
                               false, job));
      return;
    }
    std::vector<std::uint8_t> rec = std::move(head);
    w.add_float32_rows("vectors", reply.vectors);
    const auto& tail = w.bytes();
    rec.insert(rec.end(), tail.begin(), tail.end());
    post_to(session_id, ring::record_completion(Kind::embedded, ud, job, std::move(rec)));
  });
}

}  // namespace tandem::daemon
