// tandem-validate runner: the embedding workload clients (kind = "embed"; docs/validate.md "Embedding workloads").
// Each request is one Embed call through the client's Transport (D-Bus Client::embed, or a ring `embed`), with texts
// and PNG images generated from (workload, client, request) alone, so a run is repeatable. Every call is recorded
// as embed_call, then exactly one of embed_ok (job, route, count, dim) or embed_error (the typed error's name); the
// verdict rule embed_replies checks that no call went unanswered or was answered twice.
#include <cstdio>

#include "image/draw.h"
#include "validate/runner_internal.h"

namespace tandem::validate::detail {

namespace {

const char* kColours[] = {"red", "green", "blue", "yellow", "purple", "orange"};
const char* kShapes[] = {"circle", "square", "triangle"};
const image::Rgb kRgb[] = {{220, 30, 30}, {30, 180, 40}, {30, 60, 220}, {230, 210, 30}, {140, 40, 170}, {240, 140, 20}};

std::string text_for(std::uint64_t n) {
  return std::string("a ") + kColours[n % 6] + " " + kShapes[(n / 6) % 3] + " on a plain background, picture " +
         std::to_string(n);
}

Result<std::vector<std::uint8_t>> png_for(std::uint64_t n, std::uint32_t size) {
  auto img = image::blank(size, size, image::Rgb{250, 250, 250});
  const float s = static_cast<float>(size);
  const image::Rgb c = kRgb[n % 6];
  switch ((n / 6) % 3) {
    case 0: image::fill_circle(img, s / 2, s / 2, s / 3, c); break;
    case 1: image::fill_rect(img, s / 4, s / 4, 3 * s / 4, 3 * s / 4, c); break;
    default: image::fill_triangle(img, s / 2, s / 6, s / 6, 5 * s / 6, 5 * s / 6, 5 * s / 6, c); break;
  }
  return image::encode_png(img);
}

class EmbedWorker : public WorkloadClient {
 public:
  EmbedWorker(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id, std::uint32_t idx)
      : c_(c), ph_(ph), w_(w), id_(id), idx_(idx) {}

  void run(Clock::time_point phase_t0) override {
    auto t = make_transport(w_.transport, c_.bus);
    if (!t) {
      c_.rec("client_error", id_, 0, {{"error", t.error().message}});
      return;
    }
    tr_ = std::move(*t);
    tr_->on_degraded = [this](const client::DegradedChange& d) {
      c_.rec("degraded_changed", id_, 0, {{"degraded", d.degraded}, {"reason", d.reason}, {"level", d.level.value_or("")}});
    };
    if (!sleep_until(phase_t0 + std::chrono::milliseconds(w_.start_ms))) return;
    for (std::uint32_t n = 0; n < w_.requests && !interrupted(); ++n) {
      call(n);
      (void)tr_->poll(0ms);  // degraded-mode announcements (ring) and signals between calls
      if (w_.interval_ms > 0 && !sleep_until(Clock::now() + std::chrono::milliseconds(w_.interval_ms))) break;
    }
  }

 private:
  void call(std::uint32_t n) {
    const std::uint64_t global = static_cast<std::uint64_t>(idx_) * 100000 + n;
    client::EmbedRequest r;
    if (!w_.models.empty()) r.model = w_.models[global % w_.models.size()];
    if (r.model == "default") r.model.clear();
    for (std::uint32_t k = 0; k < w_.texts; ++k) r.texts.push_back(text_for(global * 31 + k));
    for (std::uint32_t k = 0; k < w_.images; ++k) {
      auto png = png_for(global * 17 + k, w_.image_size);
      if (!png) {
        c_.rec("client_error", id_, 0, {{"error", "encode_png: " + png.error().message}});
        return;
      }
      r.images.push_back(std::move(*png));
    }
    if (!w_.allow_cpu) r.options.allow_cpu = false;
    std::string key;
    if (w_.idempotency_keys) {
      key = c_.nonce + "-" + ph_.name + "-" + w_.name + "-c" + std::to_string(idx_) + "-e" + std::to_string(n);
      r.options.idempotency_key = key;
    }
    r.call_timeout = std::chrono::milliseconds(std::max<std::uint64_t>(ph_.drain_timeout_ms, 1000));
    const std::uint64_t req = c_.next_req++;
    const std::size_t inputs = r.texts.size() + r.images.size();
    c_.rec("embed_call", id_, 0,
           {{"req", req}, {"key", key}, {"model", r.model}, {"texts", r.texts.size()}, {"images", r.images.size()},
            {"workload", w_.name}, {"transport", tr_->name()}});
    auto res = tr_->embed(r);
    if (!res) {
      auto le = tr_->last_error();
      json d{{"req", req}, {"key", key}, {"error", error_name(*tr_, res.error())}, {"message", res.error().message}};
      if (le && le->retry_after_ms) d["retry_after_ms"] = *le->retry_after_ms;
      c_.rec("embed_error", id_, 0, d);
      return;
    }
    const auto& info = res->info;
    const std::uint64_t job = info.job_id.value_or(0);
    if (res->vectors.size() != inputs) {
      c_.rec("embed_error", id_, job,
             {{"req", req}, {"key", key}, {"error", "Mismatch"},
              {"message", std::to_string(res->vectors.size()) + " vectors for " + std::to_string(inputs) + " inputs"}});
      return;
    }
    c_.rec("embed_ok", id_, job,
           {{"req", req}, {"key", key}, {"route", info.route.value_or("")}, {"count", res->vectors.size()},
            {"dim", info.dim.value_or(0)}, {"degraded", info.degraded.value_or(false)},
            {"existing", info.existing.value_or(false)}, {"attempts", info.attempts.value_or(0)}});
  }

  Campaign& c_;
  const Phase& ph_;
  const Workload& w_;
  std::int32_t id_;
  std::uint32_t idx_;
  std::unique_ptr<Transport> tr_;
};

}  // namespace

std::unique_ptr<WorkloadClient> make_embed_client(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id,
                                                  std::uint32_t index_in_workload) {
  return std::make_unique<EmbedWorker>(c, ph, w, id, index_in_workload);
}

}  // namespace tandem::validate::detail
