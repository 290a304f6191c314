#include "engine/replica.h"

#include <chrono>

namespace tandem::engine {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
std::chrono::nanoseconds from_ms(double ms) {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(ms * 1e6));
}
}  // namespace

Result<std::unique_ptr<Replica>> Replica::create(std::string dir, LoadOptions opts, policy::ReplicaMode mode) {
  opts.prefault = false;  // the replica decides when to prefault
  auto r = std::unique_ptr<Replica>(new Replica(std::move(dir), std::move(opts)));
  std::lock_guard lock(r->mu_);
  // Load once whatever the mode: it validates the files, measures load and warm-up, and fixes the fingerprint.
  TANDEM_TRY(r->load_locked(/*prefault=*/true));  // measures page-in for every mode
  TANDEM_TRY(r->warm_up_locked());
  r->fingerprint_ = r->model_->fingerprint();
  r->weight_bytes_ = r->model_->load_stats().weight_bytes;
  if (mode == policy::ReplicaMode::on_demand) r->model_.reset();
  r->mode_ = mode;
  return r;
}

Status Replica::load_locked(bool prefault) {
  if (!model_) {
    const auto t0 = Clock::now();
    auto m = Model::load(dir_, opts_);
    if (!m) return fail(std::move(m).error());
    // A reload must give the same replica: files replaced underneath would change the fingerprint.
    if (!fingerprint_.digest.empty() && (*m)->fingerprint().digest != fingerprint_.digest) {
      std::string what;
      for (const auto& d : (*m)->fingerprint().diff(fingerprint_)) what += (what.empty() ? "" : ", ") + d;
      return fail(Errc::incompatible, dir_ + ": files changed since the replica was created (" + what + ")");
    }
    times_.load_ms = ms_since(t0);
    model_ = std::move(m).value();
    prefaulted_ = false;
  }
  if (prefault && !prefaulted_) {
    const auto t0 = Clock::now();
    for (const weights::MappedFile* f : model_->files().mapped_files()) f->prefault();
    times_.page_in_ms = ms_since(t0);
    prefaulted_ = true;
  }
  return {};
}

Status Replica::warm_up_locked() {
  const auto t0 = Clock::now();
  auto seq = model_->new_sequence();
  if (!seq) return fail(std::move(seq).error());
  const auto ids = model_->encode_text("warm up");
  auto l = model_->forward(**seq, ids);
  if (!l) return fail(std::move(l).error());
  times_.warm_up_ms = ms_since(t0);
  return {};
}

Result<std::shared_ptr<Model>> Replica::get() {
  std::lock_guard lock(mu_);
  if (!model_) TANDEM_TRY(load_locked(false));
  return model_;
}

Status Replica::set_mode(policy::ReplicaMode mode) {
  std::lock_guard lock(mu_);
  switch (mode) {
    case policy::ReplicaMode::warm:
      TANDEM_TRY(load_locked(true));
      TANDEM_TRY(warm_up_locked());
      break;
    case policy::ReplicaMode::mmap:
      TANDEM_TRY(load_locked(false));
      break;
    case policy::ReplicaMode::on_demand:
      model_.reset();
      prefaulted_ = false;
      break;
  }
  mode_ = mode;
  return {};
}

policy::ReplicaMode Replica::mode() const {
  std::lock_guard lock(mu_);
  return mode_;
}

bool Replica::loaded() const {
  std::lock_guard lock(mu_);
  return model_ != nullptr;
}

ReplicaTimes Replica::times() const {
  std::lock_guard lock(mu_);
  return times_;
}

policy::ReplicaMeasurements Replica::measurements(std::uint64_t host_budget_bytes) const {
  std::lock_guard lock(mu_);
  policy::ReplicaMeasurements m;
  if (times_.load_ms >= 0) m.load_time = from_ms(times_.load_ms);
  if (times_.page_in_ms >= 0) m.page_in_time = from_ms(times_.page_in_ms);
  if (times_.warm_up_ms >= 0) m.warm_up_time = from_ms(times_.warm_up_ms);
  m.model_bytes = weight_bytes_;
  m.host_budget_bytes = host_budget_bytes;
  return m;
}

}  // namespace tandem::engine
